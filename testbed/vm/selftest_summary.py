"""The self-test's fidelity section: each run's verdict split into network, compute
and host, and what the guest's accelerator means for its timing figures.

    python -m testbed.vm.selftest_summary --accel tcg \\
        "guest netem=runs/vagrant-selftest/crosscheck-netem" \\
        "host userspace=runs/vagrant-selftest/crosscheck-userspace"

prints markdown for vagrant/selftest.sh's OUT/selftest.md (docs/vagrant.md).
Pure but for reading each run's summary.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testbed.report.fidelity import PARTS, by_part

ACCEL_NOTE = {
    "kvm": "The guest ran under KVM: its compute timing is the host's CPU, as on a "
           "real machine; its figures are comparable with the host's.",
    "tcg": "The guest ran under software emulation (qemu TCG, no KVM): every guest "
           "instruction is emulated, so the roles' modeled compute overruns and their "
           "event loops lag, and the compute part of its verdict is the VM's, not the "
           "testbed's. Its network figures (shaper, RTT, drops) still judge the netem "
           "backend. Timing figures (TTFT, TPOT) of such a run are not PDD's: rerun "
           "under KVM to quote them.",
}


def section(label: str, summary: dict, accel: str | None) -> str:
    """One run's lines: the overall verdict, then each part's verdict and reasons."""
    fid = summary.get("fidelity") or {}
    lines = [f"### {label}: {fid.get('verdict') or 'not measured'}", ""]
    if accel:
        lines += [f"Accelerator: {accel}. {ACCEL_NOTE.get(accel, '')}".rstrip(), ""]
    lines += ["| part | verdict | reasons |", "|---|---|---|"]
    for part, d in by_part(fid).items():
        why = "<br>".join(d["reasons"]) or "-"
        lines.append(f"| {part} | {d['verdict'] or 'not measured'} | {why} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    ap.add_argument("--accel", choices=("kvm", "tcg"),
                    help="the guest's accelerator (named in the first run's section)")
    args = ap.parse_args(argv)
    out = ["## Fidelity by part", "",
           f"Each run's verdict split into its parts ({', '.join(PARTS)}): a guest "
           "whose compute is emulated can still show that the network was.", ""]
    for i, spec in enumerate(args.runs):
        label, sep, run_dir = spec.partition("=")
        if not sep:
            ap.error(f"{spec!r}: give LABEL=RUN_DIR")
        path = Path(run_dir) / "summary.json"
        if not path.is_file():
            out += [f"### {label}: no run ({path} missing)", ""]
            continue
        out.append(section(label, json.loads(path.read_text()), args.accel if i == 0 else None))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
