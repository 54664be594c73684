"""An external benchmark client's command line, with the gateway's addresses filled in.

``testbed serve ... -- COMMAND`` (testbed/scenario/serve.py) and
``python -m testbed.bench.client_bench -- COMMAND`` both run one unmodified
client (AIPerf, GuideLLM, ...) against the OpenAI-compatible gateway; its
arguments name what only the run knows with placeholders, filled in here:

- ``{url}``: ``http://ADDR:PORT``, the gateway; ``{base_url}``: the same + ``/v1``
- ``{model}``: the served model; ``{tokenizer}``: the shipped tokenizer directory
- ``{out}``: the run folder
- ``{trace}``: a Mooncake trace written for the client; ``{block_tokens}``: its
  tokens per hash id (AIPerf's ``--isl-block-size``)

An unknown ``{name}`` is a TestbedError naming the argument and the known
names; a literal brace is written ``{{`` / ``}}``.

Example::

    client_argv(["aiperf", "--url", "{url}"], "10.0.0.5", 8000, out, "pdd-tiny",
                tok_dir, out / "t.jsonl")   # ['aiperf', '--url', 'http://10.0.0.5:8000']
"""

from __future__ import annotations

from pathlib import Path

from testbed.errors import TestbedError


def client_argv(command: tuple[str, ...] | list[str], ip: str, port: int, out: Path,
                model: str, tokenizer: Path, trace: Path, block_tokens: int = 16) -> list[str]:
    """The client command with its placeholders filled in (module docstring)."""
    url = f"http://{ip}:{port}"
    fill = {"url": url, "base_url": url + "/v1", "model": model, "tokenizer": str(tokenizer),
            "out": str(out), "trace": str(trace), "block_tokens": str(block_tokens)}
    argv = []
    for arg in command:
        try:
            argv.append(arg.format(**fill))
        except KeyError as e:
            raise TestbedError(f"client command argument {arg!r}: unknown placeholder "
                               f"{{{e.args[0]}}} (known: {', '.join(sorted(fill))})") from None
        except (ValueError, IndexError) as e:
            raise TestbedError(f"client command argument {arg!r}: {e}") from None
    return argv
