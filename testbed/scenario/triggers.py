"""Event-triggered faults during a run: tail the roles' events files, fire on the event.

Owns ``EventTail`` (reads the new complete lines of every ``*.events.jsonl``
in a mode's log folder, each role appending its protocol events there:
``python -m testbed.pdd.run.node --events``) and ``TriggeredFaults`` (for the
faults with ``trigger:``, a ``testbed.spec.triggers.TriggerCounter`` each; when
one fires, its actions, timed from the trigger, are handed to the runner's
timeline shifted to the firing event's time). The runner polls every
``POLL_S`` while a trigger waits, so a fault lands within a few
milliseconds of its event (the events file line is flushed at once); the
``fault_trigger`` record in events.jsonl says which event fired it and
when, and ``fault_untriggered`` names a trigger that never fired (the run
then did not test what the scenario says: the report fails it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from testbed.spec.faultkinds.base import Action, FaultSpec
from testbed.spec.triggers import TriggerCounter

POLL_S = 0.005  # how often the runner reads the events files while a trigger waits


class EventTail:
    """The protocol events appended to ``folder/*.events.jsonl`` since the last ``read``."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._offsets: dict[Path, int] = {}

    def read(self) -> list[dict]:
        out = []
        for path in sorted(self.folder.glob("*.events.jsonl")):
            start = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1  # complete lines only; the rest comes next time
            self._offsets[path] = start + end
            for line in data[:end].splitlines():
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if isinstance(ev, dict) and isinstance(ev.get("t"), (int, float)):
                    out.append(ev)
        return sorted(out, key=lambda ev: ev["t"])


class TriggeredFaults:
    """The faults that start on an event, and their actions until they fire."""

    def __init__(self, faults: list[tuple[FaultSpec, list[Action]]], tail: EventTail,
                 events=None):
        self.waiting = [(f, TriggerCounter(f.trigger), acts) for f, acts in faults]
        self.tail, self.events = tail, events

    @property
    def pending(self) -> bool:
        return bool(self.waiting)

    def poll(self, t0: float) -> list[Action]:
        """Actions of the faults whose trigger fired since the last poll, their times
        counted from ``t0`` (the workload start), as the timeline wants them."""
        if not self.waiting:
            return []
        out = []
        for ev in self.tail.read():
            for fault, counter, acts in self.waiting:
                if not counter.feed(ev):  # False once fired: each fires once
                    continue
                shift = ev["t"] - t0
                if self.events is not None:
                    self.events.record("fault_trigger", fault=fault.index,
                                       fault_kind=fault.kind, trigger=fault.trigger.describe(),
                                       event=ev.get("event"), source=ev.get("name"),
                                       rid=ev.get("rid"), t_event=ev["t"],
                                       at_s=round(shift + fault.at_s, 6))
                out += [dataclasses.replace(a, at_s=a.at_s + shift) for a in acts]
        self.waiting = [w for w in self.waiting if w[1].fired is None]
        return out

    def untriggered(self) -> None:
        """At the run's end: record each trigger that never fired."""
        for fault, counter, _ in self.waiting:
            if self.events is not None:
                self.events.record("fault_untriggered", fault=fault.index,
                                   fault_kind=fault.kind, trigger=fault.trigger.describe(),
                                   seen=counter.seen)
