"""Per-token cost of each compute engine's passes: a short microbenchmark.

``python -m testbed.bench.engine_bench [--contexts 100 2000] [--engines torch hash]``
times, for the default ModelConfig of each engine (torch: 4 layers, d_model
256, float64, one thread) and a prompt of each context length:

- ``prefill``: ``model.prefill(prompt)``, per prompt token;
- ``decode_step``: one token after the prompt (20 steps, then truncated back);
- ``extend``: 100 handed-over ids after the prompt (MD's recompute), per id.

Prints one JSON line per (engine, context): microseconds per token, the best
of repeats over at least ``--min-s`` seconds each (wall time, one thread).
The torch engine at 2K context takes a few seconds; the hash engine
milliseconds. Figures: testbed/pdd/compute/hashmodel.py's docstring.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Callable

from testbed.pdd.compute.engine import ModelConfig, build_model, pin_threads

N_DECODE = 20
N_EXTEND = 100


def _best_s(fn: Callable[[], None], min_s: float) -> float:
    """Best wall time of ``fn()`` over repeats lasting at least ``min_s`` (once at least)."""
    best, t_end = float("inf"), time.perf_counter() + min_s
    while True:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() >= t_end:
            return best


def bench(engine: str, context: int, min_s: float = 0.2) -> dict:
    """Microseconds per token of prefill, decode_step and extend at ``context`` tokens."""
    cfg = ModelConfig(engine=engine)
    pin_threads(cfg, 1)
    model = build_model(cfg)
    prompt = [(7 * i + 3) % cfg.vocab_size for i in range(context)]
    _, cache = model.prefill(prompt)  # also warms torch up

    def decode() -> None:
        tok = 1
        for _ in range(N_DECODE):
            model.decode_step(cache, tok)
        cache.truncate(context)

    def extend() -> None:
        model.extend(cache, list(range(N_EXTEND)))
        cache.truncate(context)

    prefill_s = _best_s(lambda: model.prefill(prompt), min_s)
    return {"engine": engine, "context": context,
            "decode_step_us": round(_best_s(decode, min_s) / N_DECODE * 1e6, 2),
            "prefill_us_per_token": round(prefill_s / context * 1e6, 2),
            "extend_us_per_token": round(_best_s(extend, min_s) / N_EXTEND * 1e6, 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[100, 2000])
    ap.add_argument("--engines", nargs="+", default=["torch", "hash"])
    ap.add_argument("--min-s", type=float, default=0.2)
    args = ap.parse_args(argv)
    for engine in args.engines:
        for context in args.contexts:
            print(json.dumps(bench(engine, context, args.min_s)), flush=True)


if __name__ == "__main__":
    main()
