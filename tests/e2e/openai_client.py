"""A small external client for the serve tests: the official ``openai`` package against
the gateway, run inside the emulated client host (``testbed serve -- ...`` or
``testbed exec client -- ...``).

    python tests/e2e/openai_client.py BASE_URL MODEL OUT_JSON

Sends, one after another: a streaming completion (text prompt, usage chunk), a
non-streaming completion (token-id prompt), a streaming chat completion; then two bad
requests that must be refused (max_tokens 0: 400; another model: 404). Writes what it
received to OUT_JSON ({"texts": [...], "usage": ..., "errors": [...]}); exit 0 when
every answer had the shape the API promises, 1 otherwise.
"""

from __future__ import annotations

import json
import sys

import openai


def main(base_url: str, model: str, out: str) -> int:
    api = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    texts, problems = [], []
    chunks = list(api.completions.create(model=model, prompt="Cross-datacenter serving, ",
                                         max_tokens=24, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    texts.append("".join(c.choices[0].text for c in chunks if c.choices))
    usage = chunks[-1].usage
    if len(chunks) != 25 or usage is None or usage.completion_tokens != 24:
        problems.append(f"stream: {len(chunks)} chunks, usage {usage}")
    whole = api.completions.create(model=model, prompt=list(range(40, 90)), max_tokens=16,
                                   temperature=0)
    texts.append(whole.choices[0].text)
    if whole.usage.completion_tokens != 16 or whole.choices[0].finish_reason != "length":
        problems.append(f"completion: {whole.usage}, {whole.choices[0].finish_reason}")
    chat = api.chat.completions.create(model=model, max_tokens=12, temperature=0, stream=True,
                                       messages=[{"role": "user", "content": "Hello, WAN"}])
    texts.append("".join(c.choices[0].delta.content or "" for c in chat if c.choices))
    errors = []
    for call, want in ((lambda: api.completions.create(model=model, prompt="x", max_tokens=0),
                        openai.BadRequestError),
                       (lambda: api.completions.create(model="other", prompt="x", max_tokens=4),
                        openai.NotFoundError)):
        try:
            call()
            problems.append(f"not refused: expected {want.__name__}")
        except want as err:
            errors.append({"status": err.status_code, "body": err.body})
    with open(out, "w") as f:
        json.dump({"texts": texts, "usage": usage.model_dump(), "errors": errors,
                   "problems": problems}, f)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
