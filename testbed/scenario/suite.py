"""``testbed suite``: many scenarios one after another, one verdict matrix.

Owns the suite: collecting scenario files (``collect_paths``,
``load_all``: every file validated before anything runs), one scenario's
result (``finished`` from its summary.json, ``crashed``, ``interrupted``),
the outputs (``suite_json``, ``suite_md``, ``junit_xml``, ``write_outputs``)
and the loop (``run_suite``), which takes the run function as a parameter
(the CLI passes ``runner.run_scenario``; tests pass fakes). Everything but
``run_suite`` and ``write_outputs`` is pure.

The matrix: per scenario, one row per expectation (summary.json's result
joined with the scenario's spec for mode and metric) and one per mode and
token check that summary.json's ``passed`` also needs (tokens_lost,
tokens_duplicated, requests_mismatched, requests_unrecorded == 0). A scenario passes when its
summary says so; a failed one names its failing rows. A scenario that
raises is failed with the exception's text and the suite goes on; Ctrl-C
(or SIGTERM while a network is up) marks the running scenario
"interrupted" and stops the suite. The outputs are rewritten after every
scenario, so an interrupted suite keeps what finished.

Layout (docs/run-directory.md)::

    DIR/suite.json  DIR/suite.md  DIR/NAME/ (each scenario's run directory)

Example::

    scenarios = load_all(collect_paths(["scenarios/"]))
    suite = run_suite(scenarios, RunOptions(Path("runs/suite")), run_scenario)
    suite.exit_code, [r.verdict for r in suite.results]
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from testbed.errors import SpecError, TestbedError
from testbed.net.apply import Terminated
from testbed.report.fidelity import steal_line
from testbed.scenario.runner import RunOptions
from testbed.spec.scenario import Scenario, load_scenario

SUITE_JSON, SUITE_MD = "suite.json", "suite.md"
# summary.json mode metrics copied into the suite (those a mode has).
KEY_METRICS = ("requests_total", "requests_completed", "requests_failed", "requests_verified",
               "requests_mismatched", "requests_unrecorded", "tokens_lost", "tokens_duplicated", "ttft_p50_s",
               "ttft_p90_s", "ttft_p99_s", "ttft_high_hit_p50_s", "tpot_p50_ms", "e2e_p99_s", "goodput_rps",
               "rld_token_share", "relayed_share", "decision_regret_share")
# What summary.json's "passed" needs of every mode besides the expectations
# (report.summary.tokens_intact): each must be 0.
TOKEN_CHECKS = ("tokens_lost", "tokens_duplicated", "requests_mismatched",
                "requests_unrecorded")
FOLDER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

RunFn = Callable[[Scenario, RunOptions], dict]


class SuiteSpecError(SpecError):
    """Several invalid scenario files: the message lists every SpecError."""

    def __init__(self, errors: Sequence[SpecError]):
        first = errors[0]
        super().__init__(first.file, first.path, first.expected, first.got)
        self.errors = list(errors)
        self.args = (f"{len(errors)} invalid scenario files:\n"
                     + "\n".join(f"  {e}" for e in errors),)

    def __str__(self) -> str:
        return self.args[0]


# -- inputs -------------------------------------------------------------
def collect_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Scenario files in order: a directory gives its *.yaml files sorted;
    duplicates are dropped. Raises SpecError for a missing path or a
    directory without *.yaml."""
    out: list[Path] = []
    seen: set[Path] = set()
    for given in paths:
        p = Path(given)
        if p.is_dir():
            found = sorted(p.glob("*.yaml"))
            if not found:
                raise SpecError(str(p), "", "a directory with *.yaml scenario files",
                                "no *.yaml file")
        elif p.is_file():
            found = [p]
        else:
            raise SpecError(str(p), "", "a scenario YAML file or a directory of them",
                            "no such file or directory")
        for f in found:
            if f.resolve() not in seen:
                seen.add(f.resolve())
                out.append(f)
    return out


def load_all(files: Sequence[Path]) -> list[Scenario]:
    """Every scenario validated (load_scenario) before any runs; names must be
    folder-safe and unique (each is DIR/NAME). Raises SpecError naming every bad file."""
    scenarios, errors, seen = [], [], {}
    for f in files:
        try:
            sc = load_scenario(f)
        except SpecError as e:
            errors.append(e)
            continue
        if not FOLDER_NAME_RE.match(sc.name):
            errors.append(SpecError(str(f), "name", "a folder-safe name (letters, digits, "
                                    ". _ -): the suite writes DIR/NAME", sc.name))
        elif sc.name in seen:
            errors.append(SpecError(str(f), "name", f"a name not used by {seen[sc.name]} "
                                    "(both would write DIR/NAME)", sc.name))
        seen.setdefault(sc.name, str(f))
        scenarios.append(sc)
    if errors:
        raise errors[0] if len(errors) == 1 else SuiteSpecError(errors)
    return scenarios


def select(scenarios: Sequence[Scenario], only: Sequence[str] = (),
           skip: Sequence[str] = ()) -> tuple[list[Scenario], list[str]]:
    """(scenarios to run, names skipped). Unknown names in --only/--skip and
    an empty selection raise TestbedError (bad input)."""
    names = [sc.name for sc in scenarios]
    for option, given in (("--only", only), ("--skip", skip)):
        unknown = [n for n in given if n not in names]
        if unknown:
            raise TestbedError(f"{option}: no scenario named {', '.join(unknown)}; "
                               f"scenarios: {', '.join(names)}")
    keep = [sc for sc in scenarios if (not only or sc.name in only) and sc.name not in skip]
    if not keep:
        raise TestbedError("nothing to run: every scenario is left out by --only/--skip")
    return keep, [n for n in names if n not in {sc.name for sc in keep}]


# -- one scenario's result -------------------------------------------------
@dataclass
class ScenarioResult:
    name: str
    file: str
    out_dir: str
    verdict: str                 # passed | failed | interrupted
    reasons: list[str]
    wall_s: float
    backend: str | None = None
    scale: float | None = None
    modes: dict = field(default_factory=dict)     # mode -> {KEY_METRICS present}
    checks: list[dict] = field(default_factory=list)  # the matrix rows
    error: dict | None = None    # {"type", "message", "traceback"} when the run raised
    fidelity: dict | None = None  # {"verdict", "policy", "reasons", "host_steal"} (summary.json's)
    seeds: int | None = None     # suite --seeds N: judged over N seeds (NAME/seeds.md)

    def as_dict(self) -> dict:
        return {**self.__dict__, "wall_s": round(self.wall_s, 3)}


def _fmt(v: object) -> str:
    return "null" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def _spec_for(i: int, name: str, specs: Sequence[Mapping]) -> Mapping:
    if i < len(specs) and specs[i].get("name") == name:
        return specs[i]
    return next((s for s in specs if s.get("name") == name), {})


def expectation_rows(summary: Mapping, specs: Sequence[Mapping]) -> list[dict]:
    """summary.json's expectation results with mode, baseline and metric from the specs."""
    rows = []
    for i, r in enumerate(summary.get("expectations") or []):
        spec = _spec_for(i, r.get("name"), specs)
        rows.append({"kind": "expectation", "name": r.get("name"), "mode": spec.get("mode"),
                     "baseline": spec.get("baseline"), "metric": spec.get("metric"),
                     "value": r.get("value"), "bound": r.get("bound"),
                     "passed": r.get("passed") is True})
    return rows


def token_rows(summary: Mapping) -> list[dict]:
    """One row per mode and TOKEN_CHECKS metric the mode has (must be 0)."""
    rows = []
    for mode, m in (summary.get("modes") or {}).items():
        for metric in (k for k in TOKEN_CHECKS if k in m):
            rows.append({"kind": "check", "name": f"{mode}: {metric} == 0", "mode": mode,
                         "baseline": None, "metric": metric, "value": m[metric],
                         "bound": f"{metric} of {mode} == 0", "passed": m[metric] == 0})
    return rows


def failure_reasons(summary: Mapping, rows: Sequence[Mapping]) -> list[str]:
    """Why a summary did not pass: its failing rows, else what the summary says."""
    if summary.get("passed") is True:
        return []
    reasons = [f"{r['name']}: {_fmt(r['value'])} ({r['bound']})" for r in rows
               if not r["passed"]]
    if "passed" not in summary:
        return reasons + ["summary.json has no 'passed'"]
    return reasons or ["summary.json says passed=false, but every expectation and "
                       "token check passed"]


def fidelity_row(summary: Mapping) -> list[dict]:
    """The fidelity verdict as a matrix row: it fails only a strict scenario's run."""
    fid = summary.get("fidelity")
    if not fid or fid.get("verdict") is None:
        return []
    strict = fid.get("policy") == "strict"
    return [{"kind": "fidelity", "name": "fidelity", "mode": None, "baseline": None,
             "metric": "fidelity", "value": fid["verdict"],
             "bound": "faithful (fidelity: strict)" if strict else "reported",
             "passed": not strict or fid["verdict"] == "faithful"}]


def finished(sc: Scenario, out_dir: Path, summary: Mapping, wall_s: float) -> ScenarioResult:
    """The result of a scenario whose run returned its summary.json object."""
    rows = expectation_rows(summary, [e.as_dict() for e in sc.expectations]) + \
        token_rows(summary) + fidelity_row(summary)
    reasons = failure_reasons(summary, rows)
    if summary.get("passed") is True:  # a strict scenario's degraded run fails too
        reasons += [f"fidelity degraded (strict): {why}"
                    for r in rows if r["kind"] == "fidelity" and not r["passed"]
                    for why in (summary["fidelity"].get("reasons") or ["?"])]
    modes = {mode: {k: m[k] for k in KEY_METRICS if k in m}
             for mode, m in (summary.get("modes") or {}).items()}
    fid = summary.get("fidelity") or {}
    return ScenarioResult(sc.name, sc.file, str(out_dir), "failed" if reasons else "passed",
                          reasons, wall_s, summary.get("backend"), summary.get("scale"),
                          modes, rows,
                          fidelity={k: fid.get(k) for k in ("verdict", "policy", "reasons",
                                                            "host_steal")}
                          if fid else None, seeds=summary.get("seeds"))


def crashed(sc: Scenario, out_dir: Path, exc: Exception, wall_s: float) -> ScenarioResult:
    """A scenario whose run raised: failed, with the exception (and the
    traceback when it is not a TestbedError, i.e. a bug)."""
    text = f"{type(exc).__name__}: {exc}"
    tb = None if isinstance(exc, TestbedError) else \
        "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return ScenarioResult(sc.name, sc.file, str(out_dir), "failed", [text], wall_s,
                          error={"type": type(exc).__name__, "message": str(exc),
                                 "traceback": tb})


def interrupted(sc: Scenario, out_dir: Path, exc: BaseException,
                wall_s: float) -> ScenarioResult:
    why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"interrupted ({exc})"
    return ScenarioResult(sc.name, sc.file, str(out_dir), "interrupted", [why], wall_s,
                          error={"type": type(exc).__name__, "message": why,
                                 "traceback": None})


# -- the suite -------------------------------------------------------------
@dataclass
class Suite:
    out_dir: Path
    planned: list[str]           # scenario names in run order
    skipped: list[str] = field(default_factory=list)
    results: list[ScenarioResult] = field(default_factory=list)
    started_wall: str = ""
    wall_s: float = 0.0
    interrupted: bool = False

    @property
    def not_run(self) -> list[str]:
        done = {r.name for r in self.results}
        return [n for n in self.planned if n not in done]

    @property
    def passed(self) -> bool:
        return not self.not_run and all(r.verdict == "passed" for r in self.results)

    @property
    def exit_code(self) -> int:
        return 130 if self.interrupted else 0 if self.passed else 1

    def counts(self) -> dict:
        out = {v: sum(r.verdict == v for r in self.results)
               for v in ("passed", "failed", "interrupted")}
        out["not_run"] = len(self.not_run)
        return out


def suite_json(suite: Suite) -> str:
    data = {"passed": suite.passed, "interrupted": suite.interrupted,
            "exit_code": suite.exit_code, "wall_s": round(suite.wall_s, 3),
            "started_wall": suite.started_wall, "out_dir": str(suite.out_dir),
            "counts": suite.counts(),
            "scenarios": [r.as_dict() for r in suite.results],
            "not_run": suite.not_run, "skipped": suite.skipped}
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def _cell(v: object) -> str:
    return "-" if v is None else _fmt(v).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]


def suite_overview(suite: Suite) -> str:
    """The one-table view (also the CLI's output): scenario, verdict, wall, reasons."""
    c = suite.counts()
    head = (f"suite: {len(suite.planned)} scenarios: {c['passed']} passed, {c['failed']} "
            f"failed, {c['interrupted']} interrupted, {c['not_run']} not run; "
            f"wall {suite.wall_s:.1f} s")
    rows = [(r.name, r.verdict, (r.fidelity or {}).get("verdict"), _steal(r.fidelity),
             f"{r.wall_s:.1f}", "; ".join(r.reasons)) for r in suite.results] + \
        [(n, "not run", None, None, None, "") for n in suite.not_run]
    return "\n".join([head, ""] + _table(("scenario", "verdict", "fidelity", "host steal",
                                          "wall (s)", "reason"), rows))


def _steal(fid: Mapping | None) -> str | None:
    """The most any mode's cores lost to the hypervisor (testbed/report/fidelity.py
    host_steal), e.g. "4.4% (worst 21%)"; None for a run without steal figures."""
    st = (fid or {}).get("host_steal")
    return None if not st else f"{st['share']:.1%} (worst {st['worst_share']:.0%})"


def _scenario_md(r: ScenarioResult) -> list[str]:
    where = (f"{r.seeds} seeds in `{r.out_dir}` (seed-K/report.md; every metric and ratio "
             f"with its interval in seeds.md); values are medians over the seeds"
             if r.seeds else f"run directory `{r.out_dir}` (report.md there)")
    lines = ["", f"## {r.name}: {r.verdict} ({r.wall_s:.1f} s)", "",
             f"File `{r.file}`, {where}"
             + (f"; backend {r.backend}, k={_fmt(r.scale)}" if r.backend else "") + "."]
    if r.error:
        lines += ["", f"{r.error['type']}: {r.error['message']}"]
        if r.error.get("traceback"):
            lines += ["", "```", r.error["traceback"].rstrip(), "```"]
    if r.fidelity and r.fidelity.get("reasons"):
        note = steal_line(r.fidelity)
        lines += ["", f"Fidelity {r.fidelity['verdict']}:"] + \
            [f"- {why}" for why in r.fidelity["reasons"]] + ([f"- note: {note}"] if note else [])
    if r.checks:
        lines += [""] + _table(("mode", "check", "metric", "value", "bound", "result"),
                               [(c["mode"], c["name"], c["metric"], c["value"], c["bound"],
                                 "pass" if c["passed"] else "FAIL") for c in r.checks])
    if r.modes:
        modes = list(r.modes)
        metrics = [k for k in KEY_METRICS if any(k in m for m in r.modes.values())]
        lines += [""] + _table(["metric"] + modes,
                               [[k] + [r.modes[m].get(k) for m in modes] for k in metrics])
    return lines


def suite_md(suite: Suite) -> str:
    lines = [f"# Suite {suite.out_dir}", "",
             f"Started {suite.started_wall}" + (" - interrupted" if suite.interrupted else "")
             + (f"; skipped: {', '.join(suite.skipped)}" if suite.skipped else "") + ".", "",
             suite_overview(suite)]
    for r in suite.results:
        lines += _scenario_md(r)
    return "\n".join(lines) + "\n"


def _testsuite(parent: ET.Element, name: str, wall_s: float) -> ET.Element:
    return ET.SubElement(parent, "testsuite", name=name, time=f"{wall_s:.3f}")


def _result_cases(ts: ET.Element, r: ScenarioResult) -> None:
    for c in r.checks:
        case = ET.SubElement(ts, "testcase", classname=r.name, name=str(c["name"]))
        if not c["passed"]:
            ET.SubElement(case, "failure", type=c["kind"],
                          message=f"{_fmt(c['value'])} ({c['bound']})")
        if c["kind"] == "fidelity" and r.fidelity and r.fidelity.get("reasons"):
            ET.SubElement(case, "system-out").text = "\n".join(r.fidelity["reasons"])
    if r.error:
        case = ET.SubElement(ts, "testcase", classname=r.name, name="run",
                             time=f"{r.wall_s:.3f}")
        err = ET.SubElement(case, "error", type=r.error["type"],
                            message=f"{r.error['type']}: {r.error['message']}"
                            if r.verdict == "failed" else r.error["message"])
        err.text = r.error.get("traceback") or None
    elif r.verdict == "failed" and all(c["passed"] for c in r.checks):
        case = ET.SubElement(ts, "testcase", classname=r.name, name="summary passed")
        ET.SubElement(case, "failure", type="summary", message="; ".join(r.reasons))


def _count(ts: ET.Element) -> None:
    cases = ts.findall("testcase")
    ts.set("tests", str(len(cases)))
    for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        ts.set(attr, str(sum(c.find(tag) is not None for c in cases)))


def junit_xml(suite: Suite) -> str:
    """JUnit XML: a testsuite per scenario, a testcase per matrix row (failure
    when it failed), an error testcase "run" when the scenario raised or was
    interrupted, a skipped one for scenarios left out or not reached."""
    root = ET.Element("testsuites", name="testbed suite", time=f"{suite.wall_s:.3f}")
    for r in suite.results:
        _result_cases(_testsuite(root, r.name, r.wall_s), r)
    left = [(n, "not run: the suite was interrupted") for n in suite.not_run] + \
        [(n, "left out by --only/--skip") for n in suite.skipped]
    for name, why in left:
        case = ET.SubElement(_testsuite(root, name, 0.0), "testcase", classname=name, name="run")
        ET.SubElement(case, "skipped", message=why)
    for ts in root:
        _count(ts)
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(ts.get(attr)) for ts in root)))
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_outputs(suite: Suite, junit_path: Path | None = None) -> None:
    """DIR/suite.json, DIR/suite.md and the JUnit file, each replaced whole."""
    _write_atomic(suite.out_dir / SUITE_JSON, suite_json(suite))
    _write_atomic(suite.out_dir / SUITE_MD, suite_md(suite))
    if junit_path is not None:
        _write_atomic(Path(junit_path), junit_xml(suite))


def _run_one(sc: Scenario, base: RunOptions, run: RunFn, clock) -> ScenarioResult:
    """Run one scenario; KeyboardInterrupt and Terminated propagate."""
    out = base.out_dir / sc.name
    t0 = clock()
    try:
        summary = run(sc, replace(base, out_dir=out))
    except Terminated:
        raise
    except Exception as e:  # noqa: BLE001 - recorded; the suite goes on
        return crashed(sc, out, e, clock() - t0)
    return finished(sc, out, summary, clock() - t0)


def run_suite(scenarios: Sequence[Scenario], base: RunOptions, run: RunFn,
              junit_path: Path | None = None, skipped: Sequence[str] = (),
              clock: Callable[[], float] = time.monotonic) -> Suite:
    """Run ``scenarios`` in order with ``run(sc, base with out_dir=base.out_dir/NAME)``,
    rewriting the outputs after each. Ctrl-C/SIGTERM: the running scenario is
    "interrupted", the rest not run, the outputs written; ``suite.exit_code`` is 130."""
    suite = Suite(base.out_dir, [sc.name for sc in scenarios], list(skipped),
                  started_wall=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    t0 = clock()
    write_outputs(suite, junit_path)
    try:
        for i, sc in enumerate(scenarios, 1):
            t_sc = clock()
            try:
                result = _run_one(sc, base, run, clock)
            except (KeyboardInterrupt, Terminated) as e:
                suite.interrupted = True
                suite.results.append(interrupted(sc, base.out_dir / sc.name, e, clock() - t_sc))
                break
            suite.results.append(result)
            print(f"suite: [{i}/{len(scenarios)}] {sc.name}: {result.verdict} "
                  f"({result.wall_s:.1f} s)" + "".join(f"\n  {x}" for x in result.reasons),
                  file=sys.stderr)
            suite.wall_s = clock() - t0
            write_outputs(suite, junit_path)
    except KeyboardInterrupt:  # between scenarios (printing, writing)
        suite.interrupted = True
    suite.wall_s = clock() - t0
    write_outputs(suite, junit_path)
    return suite
