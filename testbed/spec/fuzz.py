"""Reader fuzzing: seeded hostile inputs for every input-file reader, and a tally.

Owns READERS (one ``Reader`` per file kind the testbed reads: topology and
scenario YAML, bandwidth-trace CSV, Mooncake JSONL, the client's workload
JSONL, the cluster config JSON), the input generators and ``run_fuzz``, which
``testbed bench fuzz`` runs. A reader passes when every input either parses
or raises SpecError with a one-line message; anything else (another
exception, a multi-line message) is counted as a traceback, with the first
few kept for the report. Plain ``random.Random`` seeded per reader, so a
case is reproducible from (seed, reader, case index).

Generators: random bytes; invalid UTF-8 spliced into a valid file; nesting
101..5,000 levels deep; random structures (None, huge ints, NaN, inf, long
and odd strings, lists, mappings) as YAML/JSON/CSV; a valid example with one
value replaced, one key dropped or an unknown key added at a random place;
hostile scalar text (``.nan``, ``1e999``, 5,000 digits, a bad date, tags,
aliases) in place of a value; byte flips, cuts and duplicated lines
(duplicate keys) in the example; empty files and non-mapping top levels.

Example::

    out = run_fuzz(cases=200, seed=1)
    out["readers"]["topology"]["tracebacks"]    # 0
"""

from __future__ import annotations

import copy
import json
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from testbed.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
KEPT_TRACEBACKS = 5
HOSTILE_YAML = (".nan", ".inf", "-.inf", "9" * 5000, "1e999", "2020-13-45", "!!binary zz",
                "!!python/object:os.system x", "&a [*a]", "*nowhere", "{[1]: 2}", "~", "''",
                "[]", "{}", "0x" + "f" * 40, "true", "-1", "0", "\"\\ud800\"", "!!set {a}")
HOSTILE_JSON = ("NaN", "Infinity", "-Infinity", "1e999", "9" * 5000, "null", "[]", "{}",
                '"x"', "true", "-1", "0", "1.5", "2e-400", '"\\ud800"', "[" * 200)
HOSTILE_CELLS = ("nan", "inf", "-inf", "-1", "0", "1e999", "", "x", "9" * 5000, "1,2,3",
                 "\"", "t_s", "\x00")
BAD_UTF8 = (b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80")


@dataclass(frozen=True)
class Reader:
    """One input-file reader: its format, a valid example and how to call it."""

    name: str
    fmt: str                      # yaml | json | jsonl | csv
    example: Callable[[], bytes]  # a valid file
    load: Callable[[Path], Any]   # raises SpecError on bad input


def _scenario_example() -> bytes:
    data = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    data["topology"] = str(ROOT / "topologies" / "two-dc.yaml")
    return yaml.safe_dump(data, sort_keys=False).encode()


def _config_example() -> bytes:
    inst = [("p0", "prefill", 7101, "A"), ("rld0", "relay_decode", 7102, "A"),
            ("md0", "main_decode", 7103, "B"), ("router", "router", 7100, "A")]
    return json.dumps({"mode": "pdd", "model": {"d_model": 64, "n_layer": 2, "n_head": 2},
                       "timing": {"time_scale": 0.5, "kv_scale_k": 10},
                       "relay": {"handoff_mode": "catch-up", "catchup_threshold_tokens": 64},
                       "instances": [{"name": n, "role": r, "host": "127.0.0.1", "port": p,
                                      "dc": d} for n, r, p, d in inst]}, indent=1).encode()


def _workload_example() -> bytes:
    lines = [{"id": i, "arrival_s": 0.5 * i, "prompt": list(range(i, i + 20)), "max_out": 8,
              "session": i % 2, "designed_hit_rate": 0.25} for i in range(4)]
    lines.append({"id": 4, "arrival_s": 0.0, "prompt": [1, 2, 3], "max_out": 2,
                  "warmup": True})
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def _mooncake_example() -> bytes:
    text = (ROOT / "tests" / "unit" / "fixtures" / "traces" / "mooncake-small.jsonl").read_text()
    return "".join(text.splitlines(keepends=True)[:6]).encode()


def reader_table() -> dict[str, Reader]:
    from testbed.pdd.roles.client import load_requests
    from testbed.pdd.run.config import load_config
    from testbed.spec.faults import load_rate_trace
    from testbed.spec.scenario import load_scenario
    from testbed.spec.topology import load_topology
    from testbed.workload.mooncake import read_trace

    return {r.name: r for r in (
        Reader("topology", "yaml", lambda: (ROOT / "topologies" / "two-dc.yaml").read_bytes(),
               load_topology),
        Reader("scenario", "yaml", _scenario_example, load_scenario),
        Reader("trace_csv", "csv", lambda: b"t_s,rate_gbit\n# ramp\n0,10\n1.5,2\n3,0.5\n",
               load_rate_trace),
        Reader("mooncake_jsonl", "jsonl", _mooncake_example, lambda p: list(read_trace(p))),
        Reader("workload_jsonl", "jsonl", _workload_example, load_requests),
        Reader("cluster_config", "json", _config_example, load_config))}


READER_NAMES = ("topology", "scenario", "trace_csv", "mooncake_jsonl", "workload_jsonl",
                "cluster_config")


# -- values and serialization ------------------------------------------------
def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    """A random value of any type, often one a reader must refuse."""
    scalars: list[Callable[[], Any]] = [
        lambda: None, lambda: True, lambda: 0, lambda: -1, lambda: 10 ** rng.randint(19, 400),
        lambda: float("nan"), lambda: float("inf"), lambda: -float("inf"),
        lambda: 1e308 * rng.choice((1, -1)), lambda: rng.random() * 10 ** rng.randint(-5, 5),
        lambda: _text(rng)]
    containers: list[Callable[[], Any]] = [
        lambda: [hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))],
        lambda: {_text(rng): hostile_value(rng, depth + 1) for _ in range(rng.randrange(4))},
        lambda: ["x"] * rng.randrange(1000)]
    return rng.choice(scalars + (containers if depth < 3 else []))()


def _text(rng: random.Random) -> str:
    return rng.choice(("", "x", "a" * 300, "name", "kind", "\x00", "\n", "a\rb", "\x85",
                       "\u2028", "é", "[", "1e3", "t_s", "-", "10.0.0.0/8", "pdd", "synthetic",
                       "\ud800"))


def dump(fmt: str, value: Any) -> bytes:
    """``value`` as a file of format ``fmt`` (bytes; lone surrogates are escaped)."""
    if fmt == "yaml":
        text = yaml.safe_dump(value, allow_unicode=True)
    elif fmt == "json":
        text = json.dumps(value)
    elif fmt == "jsonl":
        rows = value if isinstance(value, list) else [value]
        text = "".join(json.dumps(r) + "\n" for r in rows)
    else:
        rows = value if isinstance(value, list) else [[value]]
        text = "".join(",".join(str(c) for c in (r if isinstance(r, list) else [r])) + "\n"
                       for r in rows)
    return text.encode("utf-8", "backslashreplace")


def parse_example(reader: Reader) -> Any:
    text = reader.example().decode()
    if reader.fmt == "yaml":
        return yaml.safe_load(text)
    if reader.fmt == "json":
        return json.loads(text)
    if reader.fmt == "jsonl":
        return [json.loads(x) for x in text.splitlines() if x.strip()]
    return [x.split(",") for x in text.splitlines()]


# -- generators ----------------------------------------------------------------
def gen_random_bytes(rng: random.Random, reader: Reader) -> bytes:
    return rng.randbytes(rng.choice((0, 1, 7, 100, 3000)))


def gen_invalid_utf8(rng: random.Random, reader: Reader) -> bytes:
    data = reader.example()
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice(BAD_UTF8) + data[at:]


def gen_deep(rng: random.Random, reader: Reader) -> bytes:
    n = rng.choice((101, 1000, 5000, 20000))
    if reader.fmt == "yaml" and rng.random() < 0.5:
        return ("{a: " * n + "1" + "}" * n).encode()
    if reader.fmt == "yaml" and rng.random() < 0.5:
        return "".join(" " * i + "a:\n" for i in range(min(n, 2000))).encode()
    if reader.fmt == "jsonl":
        return ('{"id": ' + "[" * n + "]" * n + "}\n").encode()
    return ("[" * n + "]" * n).encode()


def gen_structure(rng: random.Random, reader: Reader) -> bytes:
    return dump(reader.fmt, hostile_value(rng))


def gen_empty_or_top(rng: random.Random, reader: Reader) -> bytes:
    return rng.choice((b"", b"\n", b"   \n\n", b"#\n", b"null\n", b"[]\n", b"3\n", b"x\n",
                       b"[1, 2]\n", b"\"s\"\n", b"\xef\xbb\xbf", b"---\n---\n", b"{}\n"))


def _random_slot(rng: random.Random, tree: Any) -> tuple[Any, Any] | None:
    """A random (container, key) in the tree, walking down from the top."""
    node, slot = tree, None
    while isinstance(node, (dict, list)) and node:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        slot = (node, key)
        if rng.random() < 0.35:
            break
        node = node[key]
    return slot


def gen_mutated_tree(rng: random.Random, reader: Reader) -> bytes:
    tree = copy.deepcopy(parse_example(reader))
    for _ in range(rng.randint(1, 3)):
        slot = _random_slot(rng, tree)
        if slot is None:
            break
        node, key = slot
        action = rng.randrange(4)
        if action == 0 and isinstance(node, dict):
            del node[key]
        elif action == 1 and isinstance(node, dict):
            node[_text(rng) or "extra"] = hostile_value(rng)
        else:
            node[key] = hostile_value(rng) if reader.fmt != "csv" else rng.choice(HOSTILE_CELLS)
    return dump(reader.fmt, tree)


def gen_hostile_scalar(rng: random.Random, reader: Reader) -> bytes:
    """A value's text replaced by a hostile token (after ': ' or between commas)."""
    lines = reader.example().decode().splitlines()
    i = rng.randrange(len(lines))
    sep = ": " if reader.fmt != "csv" else ","
    tokens = {"yaml": HOSTILE_YAML, "csv": HOSTILE_CELLS}.get(reader.fmt, HOSTILE_JSON)
    parts = lines[i].split(sep)
    if len(parts) > 1:
        k = rng.randrange(1, len(parts))
        tail = parts[k][len(parts[k].rstrip("]}, ")):] if reader.fmt != "csv" else ""
        parts[k] = rng.choice(tokens) + tail
    lines[i] = sep.join(parts)
    return ("\n".join(lines) + "\n").encode("utf-8", "backslashreplace")


def gen_mutated_bytes(rng: random.Random, reader: Reader) -> bytes:
    data = bytearray(reader.example())
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(data) + 1)
        action = rng.randrange(4)
        if action == 0 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif action == 1:
            data[at:at + rng.randrange(1, 40)] = b""
        elif action == 2:
            data[at:at] = rng.randbytes(rng.randrange(1, 8))
        else:
            lines = bytes(data).splitlines(keepends=True) or [b""]
            k = rng.randrange(len(lines))
            data = bytearray(b"".join(lines[:k + 1] + [lines[k]] + lines[k + 1:]))
    return bytes(data)


GENERATORS: dict[str, Callable[[random.Random, Reader], bytes]] = {
    "random_bytes": gen_random_bytes, "invalid_utf8": gen_invalid_utf8, "deep": gen_deep,
    "structure": gen_structure, "empty_or_top": gen_empty_or_top,
    "mutated_tree": gen_mutated_tree, "hostile_scalar": gen_hostile_scalar,
    "mutated_bytes": gen_mutated_bytes}


# -- running -------------------------------------------------------------------
def classify(reader: Reader, path: Path) -> tuple[str, str]:
    """('accepted' | 'rejected' | 'traceback', message) for the file at ``path``."""
    try:
        reader.load(path)
    except SpecError as e:
        msg = str(e)
        return ("traceback", "multi-line SpecError: " + msg[:300]) \
            if len(msg.splitlines()) > 1 else ("rejected", msg)
    except Exception as e:  # noqa: BLE001 - the point: any other exception is a finding
        return "traceback", f"{type(e).__name__}: {str(e)[:300]}"
    return "accepted", ""


def fuzz_reader(reader: Reader, cases: int, seed: int, workdir: Path) -> dict:
    """Run ``cases`` generated inputs through one reader; the tally as a dict."""
    rng = random.Random(f"{seed}:{reader.name}")
    path = workdir / f"{reader.name}.{reader.fmt}"
    counts = {"cases": 0, "accepted": 0, "rejected": 0, "tracebacks": 0}
    first: list[dict] = []
    names = list(GENERATORS)
    for case in range(cases):
        gen = rng.choice(names)
        data = GENERATORS[gen](rng, reader)
        path.write_bytes(data)
        verdict, msg = classify(reader, path)
        counts["cases"] += 1
        counts[verdict if verdict != "traceback" else "tracebacks"] += 1
        if verdict == "traceback" and len(first) < KEPT_TRACEBACKS:
            first.append({"case": case, "generator": gen, "error": msg,
                          "input_head": repr(data[:120])})
    return {**counts, "first_tracebacks": first}


def run_fuzz(cases: int = 10_000, seed: int = 1, readers: tuple[str, ...] = READER_NAMES
             ) -> dict:
    """Fuzz every reader (``cases`` inputs each); JSON-ready result with totals."""
    table = reader_table()
    out: dict = {"seed": seed, "cases_per_reader": cases, "readers": {}}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="testbed-fuzz-") as tmp:
        for name in readers:
            out["readers"][name] = fuzz_reader(table[name], cases, seed, Path(tmp))
    out["tracebacks_total"] = sum(r["tracebacks"] for r in out["readers"].values())
    out["elapsed_s"] = round(time.monotonic() - t0, 1)
    return out
