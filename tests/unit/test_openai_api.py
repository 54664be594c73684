"""The gateway's request checks and answer bodies (testbed.pdd.roles.openai_api), no I/O.

Each bad body gets the status, param and code an OpenAI client expects; good
bodies become the prompt ids and max_tokens the router is sent.
"""

from __future__ import annotations

import pytest

from testbed.errors import ApiError
from testbed.pdd.roles import openai_api as api

SERVED = api.Served("pdd-tiny", 512, 64, 0)


def encode(text: str) -> list[int]:
    return [ord(c) % 512 for c in text]


GOOD = {"model": "pdd-tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0}

BAD = [  # (body, status, param, code, words in the message)
    ([1, 2], 400, None, None, "JSON object"),
    ({**GOOD, "prompt": ""}, 400, "prompt", None, "empty"),
    ({**GOOD, "prompt": []}, 400, "prompt", None, "empty"),
    ({k: v for k, v in GOOD.items() if k != "prompt"}, 400, "prompt", None, "required"),
    ({**GOOD, "prompt": 7}, 400, "prompt", None, "must be a string"),
    ({**GOOD, "prompt": [1, "a"]}, 400, "prompt", None, "batched"),
    ({**GOOD, "prompt": ["a", "b"]}, 400, "prompt", None, "batched"),
    ({**GOOD, "prompt": [1, 512]}, 400, "prompt", None, "outside the vocabulary"),
    ({**GOOD, "prompt": [-1]}, 400, "prompt", None, "outside the vocabulary"),
    ({**GOOD, "prompt": [True]}, 400, "prompt", None, "must be a string"),
    ({**GOOD, "max_tokens": 0}, 400, "max_tokens", None, "at least 1"),
    ({**GOOD, "max_tokens": "4"}, 400, "max_tokens", None, "an integer"),
    ({**GOOD, "max_tokens": 4.0}, 400, "max_tokens", None, "an integer"),
    ({**GOOD, "max_tokens": True}, 400, "max_tokens", None, "an integer"),
    ({**GOOD, "max_tokens": 60}, 400, "max_tokens", "context_length_exceeded", "64 tokens"),
    ({**GOOD, "prompt": "x" * 64}, 400, "prompt", "context_length_exceeded", "64 in the"),
    ({**GOOD, "model": "gpt-4"}, 404, "model", "model_not_found", "`gpt-4`"),
    ({**GOOD, "model": 3}, 400, "model", None, "a string"),
    ({**GOOD, "temperature": 0.7}, 400, "temperature", None, "greedily"),
    ({**GOOD, "temperature": "0"}, 400, "temperature", None, "a number"),
    ({**GOOD, "top_p": 0.9}, 400, "top_p", None, "greedily"),
    ({**GOOD, "n": 2}, 400, "n", None, "one sequence"),
    ({**GOOD, "stream": "yes"}, 400, "stream", None, "a boolean"),
    ({**GOOD, "stream_options": {"include_usage": True}}, 400, "stream_options", None,
     "only allowed"),
    ({**GOOD, "stream": True, "stream_options": {"include_usage": 1}}, 400, "include_usage",
     None, "a boolean"),
    ({**GOOD, "stop": ["\n"]}, 400, "stop", None, "not supported"),
    ({**GOOD, "logprobs": 2}, 400, "logprobs", None, "not supported"),
    ({**GOOD, "ignore_eos": "no"}, 400, "ignore_eos", None, "a boolean"),
]


@pytest.mark.parametrize("body,status,param,code,words", BAD)
def test_a_bad_completion_body_gets_an_openai_error(body, status, param, code, words):
    with pytest.raises(ApiError) as info:
        api.parse_completion(body, SERVED, encode)
    err = info.value
    assert (err.status, err.param, err.code) == (status, param, code), err.message
    assert words in err.message
    body = err.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["type"] == "invalid_request_error"


@pytest.mark.parametrize("prompt,ids", [("hi", encode("hi")), ([5, 6], [5, 6]),
                                        (["hi"], encode("hi")), ([[5, 6]], [5, 6])])
def test_a_prompt_is_text_or_token_ids(prompt, ids):
    gen = api.parse_completion({**GOOD, "prompt": prompt, "ignore_eos": True,
                                "min_tokens": 4, "unknown": {"x": 1}}, SERVED, encode)
    assert gen.prompt_ids == tuple(ids) and gen.max_tokens == 4 and not gen.stream


def test_defaults_greedy_16_tokens_and_the_served_model():
    gen = api.parse_completion({"prompt": "hi"}, SERVED, encode)
    assert (gen.model, gen.max_tokens, gen.stream, gen.include_usage) == \
        ("pdd-tiny", api.DEFAULT_MAX_TOKENS, False, False)
    gen = api.parse_completion({"prompt": "hi", "stream": True, "user": "u1",
                                "stream_options": {"include_usage": True}}, SERVED, encode)
    assert gen.stream and gen.include_usage and gen.session == "u1"


def test_chat_uses_the_trivial_template_and_max_completion_tokens():
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert api.chat_prompt(msgs) == "system: be brief\nuser: hi\nassistant: "
    gen = api.parse_chat({"messages": msgs, "max_completion_tokens": 3, "max_tokens": 9},
                         SERVED, encode)
    assert gen.chat and gen.max_tokens == 3
    assert gen.prompt_ids == tuple(encode(api.chat_prompt(msgs)))


@pytest.mark.parametrize("messages,param", [([], "messages"), ("hi", "messages"),
                                            ([{"role": "robot", "content": "x"}], "messages[0]"),
                                            ([{"role": "user", "content": 3}],
                                             "messages[0].content"),
                                            ([{"role": "user", "content": [{"type": "image"}]}],
                                             "messages[0].content")])
def test_a_bad_message_list_is_a_400(messages, param):
    with pytest.raises(ApiError) as info:
        api.parse_chat({"messages": messages}, SERVED, encode)
    assert (info.value.status, info.value.param) == (400, param)


def test_answer_bodies_have_the_openai_shape():
    gen = api.parse_completion({**GOOD, "stream": True,
                                "stream_options": {"include_usage": True}}, SERVED, encode)
    chunk = api.chunk_body(gen, "cmpl-1", 5, "a", None)
    assert chunk["object"] == "text_completion" and chunk["usage"] is None
    assert chunk["choices"] == [{"index": 0, "text": "a", "logprobs": None,
                                 "finish_reason": None}]
    last = api.usage_chunk(gen, "cmpl-1", 5, 4)
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 5,
                                                       "completion_tokens": 4,
                                                       "total_tokens": 9}
    chat = api.parse_chat({"messages": [{"role": "user", "content": "x"}]}, SERVED, encode)
    first = api.chunk_body(chat, "cmpl-2", 5, "b", None, first=True)
    assert first["object"] == "chat.completion.chunk" and "usage" not in first
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "b"}
    whole = api.response_body(chat, "cmpl-2", 5, "bc", 2, "length")
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "bc"}
    assert whole["usage"]["completion_tokens"] == 2
    assert api.models_body(SERVED)["data"][0]["id"] == "pdd-tiny"
