"""The OpenAI-compatible API of the gateway, as pure functions: requests in, bodies out.

Owns what a JSON body of ``POST /v1/completions`` or ``POST /v1/chat/completions``
may hold and what the answers look like; no I/O (``gateway.py`` serves them).
``parse_completion`` / ``parse_chat`` turn a decoded body into a ``Generate``
(prompt ids, max_tokens, stream, include_usage) or raise ``ApiError`` with
the HTTP status and an OpenAI-style error body:

- 400 ``invalid_request_error``: the body is not a JSON object, a known field
  has the wrong type (``param`` names it), an empty prompt or message list, a
  token id outside the vocabulary, ``max_tokens`` < 1, more than one prompt
  (batched prompts), ``n``/``best_of`` != 1, ``temperature`` != 0 (the
  roles decode greedily; an absent temperature means greedy too), ``top_p``
  != 1, stop sequences, logprobs, echo, non-zero penalties,
  ``stream_options`` without ``stream``;
- 400 ``context_length_exceeded``: prompt + max_tokens > the model's context;
- 404 ``model_not_found``: ``model`` is not the served model (absent: the
  served one).

Unknown fields are ignored (as vLLM does: benchmark clients send extras
such as ``min_tokens``). ``ignore_eos`` is accepted and has no effect: the
tiny model has no end-of-sequence token, every request yields exactly
``max_tokens`` tokens (finish_reason ``length``). ``max_tokens`` defaults
to 16 (OpenAI's completions default), for chat too; chat also reads
``max_completion_tokens``. The chat template is
``"".join(f"{role}: {content}\\n") + "assistant: "``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.errors import ApiError

DEFAULT_MAX_TOKENS = 16
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Served:
    """What the gateway serves: the model's name, vocabulary and context."""

    model: str
    vocab_size: int
    max_context: int
    created: int  # unix time, for /v1/models


@dataclass(frozen=True)
class Generate:
    """One validated generation request."""

    chat: bool
    model: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    stream: bool
    include_usage: bool
    session: str | int = 0


def _bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code=code)


def _kind(v: object) -> str:
    return "null" if v is None else {bool: "a boolean", int: "an integer", float: "a number",
                                     str: "a string", list: "an array",
                                     dict: "an object"}.get(type(v), type(v).__name__)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: object) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v))


def _opt(body: dict, key: str, ok, expected: str):
    """body[key] if absent/null or ``ok(value)``; else a 400 naming the field."""
    v = body.get(key)
    if v is not None and not ok(v):
        raise _bad(f"'{key}' must be {expected}, got {_kind(v)}: {str(v)[:80]}", key)
    return v


def _common(body: object, served: Served, chat: bool) -> dict:
    """The fields both endpoints share, checked; returns model/stream/usage/max_tokens."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {_kind(body)}")
    model = _opt(body, "model", lambda v: isinstance(v, str), "a string")
    if model is not None and model != served.model:
        raise ApiError(404, f"The model `{model}` does not exist (this server serves "
                       f"`{served.model}`).", "model", code="model_not_found")
    stream = bool(_opt(body, "stream", lambda v: isinstance(v, bool), "a boolean"))
    options = _opt(body, "stream_options", lambda v: isinstance(v, dict), "an object")
    if options is not None and not stream:
        raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    usage = bool(_opt(options or {}, "include_usage", lambda v: isinstance(v, bool),
                      "a boolean"))
    keys = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    max_tokens, key = DEFAULT_MAX_TOKENS, "max_tokens"
    for k in keys:
        v = _opt(body, k, _is_int, "an integer")
        if v is not None:
            max_tokens, key = v, k
            break
    if max_tokens < 1:
        raise _bad(f"'{key}' must be at least 1, got {max_tokens}", key)
    _sampling(body)
    _opt(body, "ignore_eos", lambda v: isinstance(v, bool), "a boolean")
    user = _opt(body, "user", lambda v: isinstance(v, str), "a string")
    return {"model": served.model, "stream": stream, "include_usage": usage,
            "max_tokens": max_tokens, "max_key": key, "session": user or 0}


def _sampling(body: dict) -> None:
    """Only greedy decoding of one sequence is served."""
    t = _opt(body, "temperature", _is_num, "a number")
    if t is not None and t != 0:
        raise _bad(f"'temperature' must be 0: this server decodes greedily (got {t})",
                   "temperature")
    top_p = _opt(body, "top_p", _is_num, "a number")
    if top_p is not None and top_p != 1:
        raise _bad(f"'top_p' must be 1: this server decodes greedily (got {top_p})", "top_p")
    for key in ("n", "best_of"):
        v = _opt(body, key, _is_int, "an integer")
        if v is not None and v != 1:
            raise _bad(f"'{key}' must be 1: one sequence per request (got {v})", key)
    for key in ("presence_penalty", "frequency_penalty"):
        v = _opt(body, key, _is_num, "a number")
        if v:
            raise _bad(f"'{key}' must be 0: no penalties with greedy decoding (got {v})", key)
    stop = _opt(body, "stop", lambda v: isinstance(v, (str, list)), "a string or an array")
    if stop:
        raise _bad("'stop' sequences are not supported (the tiny model has no stop text)",
                   "stop")
    logprobs = body.get("logprobs")
    if logprobs not in (None, False, 0):
        raise _bad("'logprobs' are not supported", "logprobs")
    if _opt(body, "echo", lambda v: isinstance(v, bool), "a boolean"):
        raise _bad("'echo' is not supported", "echo")


def _check_length(served: Served, ids: list[int], max_tokens: int, key: str) -> None:
    if not ids:
        raise _bad("the prompt is empty", "prompt" if key == "max_tokens" else "messages")
    if len(ids) + max_tokens > served.max_context:
        raise _bad(f"This model's maximum context length is {served.max_context} tokens. "
                   f"However, you requested {len(ids) + max_tokens} tokens ({len(ids)} in "
                   f"the prompt, {max_tokens} for the completion). Please reduce the prompt "
                   f"or '{key}'.", key if len(ids) < served.max_context else "prompt",
                   code="context_length_exceeded")


def _prompt_ids(prompt: object, served: Served, encode) -> list[int]:
    if isinstance(prompt, list) and prompt and not all(_is_int(t) for t in prompt):
        if len(prompt) > 1:
            raise _bad(f"batched prompts ({len(prompt)}) are not supported: send one prompt "
                       "per request", "prompt")
        prompt = prompt[0]  # a batch of one: ["text"] or [[ids]]
    if isinstance(prompt, str):
        return encode(prompt)
    if not isinstance(prompt, list) or not all(_is_int(t) for t in prompt):
        raise _bad(f"'prompt' must be a string, an array of token ids or an array of one "
                   f"of those, got {_kind(prompt)}", "prompt")
    bad = [t for t in prompt if not 0 <= t < served.vocab_size]
    if bad:
        raise _bad(f"'prompt' has token id {bad[0]} outside the vocabulary "
                   f"[0, {served.vocab_size})", "prompt")
    return list(prompt)


def parse_completion(body: object, served: Served, encode) -> Generate:
    """A ``POST /v1/completions`` body; ``encode(text) -> ids``. ApiError if bad."""
    c = _common(body, served, chat=False)
    if "prompt" not in body or body["prompt"] is None:
        raise _bad("'prompt' is required", "prompt")
    ids = _prompt_ids(body["prompt"], served, encode)
    _check_length(served, ids, c["max_tokens"], c["max_key"])
    return Generate(False, c["model"], tuple(ids), c["max_tokens"], c["stream"],
                    c["include_usage"], c["session"])


def chat_prompt(messages: object) -> str:
    """The trivial chat template (module docstring); ApiError for a bad message list."""
    if not isinstance(messages, list) or not messages:
        raise _bad("'messages' must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES:
            raise _bad(f"'{where}' must be an object with a 'role' in "
                       f"{', '.join(CHAT_ROLES)}", where)
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise _bad(f"'{where}.content' parts must be text parts", f"{where}.content")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise _bad(f"'{where}.content' must be a string or an array of text parts, "
                       f"got {_kind(content)}", f"{where}.content")
        out.append(f"{m['role']}: {content}\n")
    return "".join(out) + "assistant: "


def parse_chat(body: object, served: Served, encode) -> Generate:
    """A ``POST /v1/chat/completions`` body. ApiError if bad."""
    c = _common(body, served, chat=True)
    ids = encode(chat_prompt(body.get("messages")))
    _check_length(served, ids, c["max_tokens"], c["max_key"])
    return Generate(True, c["model"], tuple(ids), c["max_tokens"], c["stream"],
                    c["include_usage"], c["session"])


# -- answers ------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _head(gen: Generate, rid: str, created: int, chunk: bool) -> dict:
    obj = ("chat.completion.chunk" if chunk else "chat.completion") if gen.chat \
        else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": gen.model}


def response_body(gen: Generate, rid: str, created: int, text: str, n_out: int,
                  finish_reason: str) -> dict:
    """The non-streaming answer."""
    if gen.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**_head(gen, rid, created, False), "choices": [choice],
            "usage": usage(len(gen.prompt_ids), n_out)}


def chunk_body(gen: Generate, rid: str, created: int, text: str | None,
               finish_reason: str | None, first: bool = False) -> dict:
    """One streamed chunk: a token's text (chat: ``delta.content``; the first chat
    chunk also carries ``delta.role``), or the finish reason with empty text."""
    if gen.chat:
        delta = {"role": "assistant"} if first else {}
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None,
                  "finish_reason": finish_reason}
    out = {**_head(gen, rid, created, True), "choices": [choice]}
    if gen.include_usage:
        out["usage"] = None
    return out


def usage_chunk(gen: Generate, rid: str, created: int, n_out: int) -> dict:
    """The last chunk before ``[DONE]`` when ``stream_options.include_usage``."""
    return {**_head(gen, rid, created, True), "choices": [],
            "usage": usage(len(gen.prompt_ids), n_out)}


def models_body(served: Served) -> dict:
    return {"object": "list", "data": [{"id": served.model, "object": "model",
                                        "created": served.created, "owned_by": "testbed",
                                        "max_model_len": served.max_context}]}
