"""Fuzzing the input-file readers: any file parses or raises SpecError, nothing else.

Every reader of testbed.spec.fuzz.READERS (topology and scenario YAML, the
bandwidth-trace CSV, Mooncake and workload JSONL, the cluster config JSON)
gets random bytes, random structures, spliced and mutated valid examples;
explicit regressions pin the failures found on main (a UnicodeDecodeError
and a RecursionError traceback from ``testbed validate``) and check that the
CLI answers bad input with exit 2 and one line naming the file and field.
The big run is ``testbed bench fuzz`` (docs/robustness.md).
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.cli import main
from testbed.errors import SpecError
from testbed.spec.fuzz import GENERATORS, READER_NAMES, dump, reader_table

READERS = reader_table()
FUZZ = settings(max_examples=50, deadline=None, derandomize=True)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def parses_or_spec_error(name: str, data: bytes, workdir) -> None:
    """The reader accepts the file or raises a one-line SpecError naming it."""
    reader = READERS[name]
    path = workdir / f"{name}.{reader.fmt}"
    path.write_bytes(data)
    try:
        reader.load(path)
    except SpecError as e:
        assert len(str(e).splitlines()) == 1 and str(e).startswith(str(path)), str(e)


@pytest.mark.parametrize("name", READER_NAMES)
@FUZZ
@given(data=st.binary(max_size=3000))
def test_random_bytes(workdir, name, data):
    parses_or_spec_error(name, data, workdir)


@pytest.mark.parametrize("name", READER_NAMES)
@FUZZ
@given(value=values)
def test_random_structures(workdir, name, value):
    parses_or_spec_error(name, dump(READERS[name].fmt, value), workdir)


@pytest.mark.parametrize("name", READER_NAMES)
@FUZZ
@given(at=st.floats(0, 1), cut=st.integers(0, 30), insert=st.binary(max_size=12))
def test_spliced_examples(workdir, name, at, cut, insert):
    example = READERS[name].example()
    i = int(at * len(example))
    parses_or_spec_error(name, example[:i] + insert + example[i + cut:], workdir)


@pytest.mark.parametrize("name", READER_NAMES)
@FUZZ
@given(seed=st.integers(0, 2**32 - 1), gen=st.sampled_from(sorted(GENERATORS)))
def test_generated_inputs(workdir, name, seed, gen):
    parses_or_spec_error(name, GENERATORS[gen](random.Random(seed), READERS[name]), workdir)


@pytest.mark.parametrize("name", READER_NAMES)
def test_the_examples_are_accepted(workdir, name):
    reader = READERS[name]
    path = workdir / f"ok-{name}.{reader.fmt}"
    path.write_bytes(reader.example())
    reader.load(path)


# -- regressions through the CLI ---------------------------------------------------
def validate(path, capsys) -> str:
    """``testbed validate path``: exit 2 and exactly one line on stderr, naming the file."""
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr()
    lines = (out.out + out.err).strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], lines
    return lines[0]


@pytest.mark.parametrize("data", [
    random.Random(12).randbytes(4000),
    b"name: two-dc\ndescription: \xff\xfe\n",
    b"\xed\xa0\x80: 1\n",
    ("[" * 5000 + "]" * 5000).encode(),
    ("{a: " * 5000 + "1" + "}" * 5000).encode(),
    "".join(" " * i + "a:\n" for i in range(5000)).encode(),
    b"name: " + b"9" * 6000 + b"\n",
    b"when: 2020-13-45\n",
    b"{[1]: 2}\n",
    b"&a [*a]\n",
    b"",
    b"- a\n- b\n",
    b"name: a\nx: \x01\n",
], ids=["random-bytes", "invalid-utf8", "surrogate", "deep-flow-list", "deep-flow-map",
        "deep-block-map", "huge-int", "bad-date", "unhashable-key", "recursive-alias", "empty",
        "top-level-list", "control-character"])
def test_validate_rejects_hostile_yaml_in_one_line(tmp_path, capsys, data):
    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    validate(path, capsys)


TOPOLOGY = READERS["topology"].example().decode()


@pytest.mark.parametrize("old,new,field", [
    ("    rate_gbit: 10\n", "    rate_gbit: .nan\n", "wan.link.rate_gbit"),
    ("    rate_gbit: 10\n", "    rate_gbit: .inf\n", "wan.link.rate_gbit"),
    ("    rate_gbit: 10\n", "    rate_gbit: " + "9" * 400 + "\n", "wan.link.rate_gbit"),
    ("    rate_gbit: 10\n", "    rate_gbit: 10\n    rate_gbit: 20\n", "duplicate key 'rate_gbit'"),
    ("  link:\n", "  link:\n    queue_limit_pkts: " + "9" * 30 + "\n", "queue_limit_pkts"),
    ("wan:\n", "wan: ~\nold_wan:\n", "wan"),
    ("wan:\n", "wan: [1]\nold_wan:\n", "wan"),
])
def test_validate_names_the_field(tmp_path, capsys, old, new, field):
    assert old in TOPOLOGY
    path = tmp_path / "topo.yaml"
    path.write_text(TOPOLOGY.replace(old, new, 1))
    assert field in validate(path, capsys)


@pytest.mark.parametrize("name", ["mooncake_jsonl", "workload_jsonl", "cluster_config"])
@pytest.mark.parametrize("text", [
    "[" * 5000 + "]" * 5000,
    "{\"a\": " * 150 + "1" + "}" * 150,
    '{"timestamp": NaN}',
    '{"id": 1, "id": 2}',
    "9" * 6000,
    "\udcff",
])
def test_json_readers_reject_hostile_documents(tmp_path, name, text):
    path = tmp_path / "bad.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(SpecError) as info:
        READERS[name].load(path)
    assert info.value.file == str(path) and len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("name,field,raw", [
    ("mooncake_jsonl", "timestamp", "1" + "0" * 400),
    ("mooncake_jsonl", "input_length", "1e999"),
    ("workload_jsonl", "arrival_s", "-1e999"),
    ("workload_jsonl", "prompt", '[1, "x"]'),
    ("workload_jsonl", "max_out", "0"),
    ("workload_jsonl", "colour", "1"),
])
def test_jsonl_errors_name_line_and_field(tmp_path, name, field, raw):
    lines = READERS[name].example().decode().splitlines()
    obj = json.loads(lines[1])
    obj[field] = "@@"
    lines[1] = json.dumps(obj).replace('"@@"', raw)
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError) as info:
        READERS[name].load(path)
    assert info.value.path == f"line 2: {field}", str(info.value)


@pytest.mark.parametrize("section,field,raw", [
    ("timing", "time_scale", "1e999"),
    ("timing", "kv_bytes_per_token", "1" + "0" * 30),
    ("model", "n_head", "0"),
])
def test_cluster_config_rejects_non_finite_and_huge_numbers(tmp_path, section, field, raw):
    cfg = json.loads(READERS["cluster_config"].example())
    cfg[section][field] = "@@"
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cfg).replace('"@@"', raw))
    with pytest.raises(SpecError) as info:
        READERS["cluster_config"].load(path)
    assert info.value.path.startswith(section), str(info.value)


@pytest.mark.parametrize("row,column", [("1,nan", "rate_gbit"), ("inf,1", "t_s"),
                                        ("1,2000", "rate_gbit"), ("-1,1", "t_s")])
def test_trace_csv_rejects_non_finite_values(tmp_path, row, column):
    path = tmp_path / "rates.csv"
    path.write_text(f"t_s,rate_gbit\n0,10\n{row}\n")
    with pytest.raises(SpecError) as info:
        READERS["trace_csv"].load(path)
    assert info.value.path == f"row 3: {column}", str(info.value)  # the header is row 1


def test_bench_fuzz_reports_no_tracebacks(tmp_path, capsys):
    out = tmp_path / "fuzz.json"
    assert main(["bench", "fuzz", "--cases", "15", "--seed", "3", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    assert set(result["readers"]) == set(READER_NAMES) and result["tracebacks_total"] == 0
    assert all(r["cases"] == 15 == r["accepted"] + r["rejected"]
               for r in result["readers"].values())
