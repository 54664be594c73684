"""The events log: every applied change, one JSON object per line.

Owns events.jsonl. Each record carries ``t_mono`` (``testbed.clock.now()``: the
machine's monotonic clock, or a virtual run's simulated one; the clock every
other record of a run uses), ``t_wall`` and a ``kind`` with its
fields. One EventLog is one run's log: it starts the file afresh (a second run
into the same folder must not mix its events with the first's: the workload
window of goodput_rps spans every workload_start..workload_end of the file),
then appends and flushes per record so it survives a crash.

Example::

    log = EventLog(Path("runs/x/events.jsonl"))
    log.record("set_link", link="wan", rate_gbit=5)
"""

from __future__ import annotations

import json
from pathlib import Path

from testbed import clock


class EventLog:
    def __init__(self, path: Path | None = None):
        self.path = path
        self.records: list[dict] = []
        self._fh = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = path.open("w")

    def record(self, kind: str, **fields) -> dict:
        rec = {"t_mono": clock.now(), "t_wall": clock.wall_ns() / 1e9, "kind": kind, **fields}
        self.records.append(rec)
        if self._fh:
            self._fh.write(json.dumps(rec, default=str) + "\n")
            self._fh.flush()
        return rec

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None
