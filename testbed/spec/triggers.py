"""Faults that start on a protocol event instead of at a time.

Owns ``Trigger`` (a fault's ``trigger:``: which event, its how-manieth, from
whom, how long after; not ``on:``, which YAML reads as the boolean true), its parsing, and ``TriggerCounter``, which reads events one
at a time and says when its trigger fires. The events are the ones the roles
write to their events files (``testbed.types.PROTOCOL_EVENTS``: a JSON line
``{"t", "event", "role", "name", "rid", ...}`` each, ``t`` on the system-wide
monotonic clock); the runner (testbed/scenario/triggers.py) tails those files
during a run and starts the fault's actions ``delay_s`` after the firing
event, as if the fault's ``at_s`` were that moment. Pure: no file, no clock.

Example YAML (a fault)::

    - {trigger: {event: handoff_sent, nth: 3, role: relay_decode, delay_s: 0.01},
       kind: restart, role: main_decode, down_s: 5}

Example::

    c = TriggerCounter(Trigger("handoff_sent", nth=3))
    fired = next(ev for ev in events if c.feed(ev))   # the third HANDOFF batch sent
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from testbed.reader import Fields
from testbed.types import PROTOCOL_EVENTS

ROLE_NAMES = ("prefill", "relay_decode", "main_decode")


@dataclass(frozen=True)
class Trigger:
    """Fire on the ``nth`` event named ``event`` whose writer matches ``source`` (a role,
    an instance name, or None: any), ``delay_s`` after it."""

    event: str
    nth: int = 1
    source: str | None = None
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.event not in PROTOCOL_EVENTS:
            raise ValueError(f"trigger event {self.event!r}: expected one of "
                             f"{', '.join(PROTOCOL_EVENTS)}")
        if not isinstance(self.nth, int) or self.nth < 1:
            raise ValueError(f"trigger nth {self.nth!r}: expected an integer >= 1")

    def matches(self, ev: Mapping) -> bool:
        if ev.get("event") != self.event:
            return False
        return self.source is None or self.source in (ev.get("role"), ev.get("name"))

    def describe(self) -> str:
        who = f" from {self.source}" if self.source else ""
        after = f" + {self.delay_s:g} s" if self.delay_s else ""
        return f"on {self.event} #{self.nth}{who}{after}"


class TriggerCounter:
    """Counts the events matching one trigger; ``feed`` is True exactly once, on the
    ``nth`` match."""

    def __init__(self, trigger: Trigger):
        self.trigger = trigger
        self.seen = 0
        self.fired: Mapping | None = None  # the event it fired on

    def feed(self, ev: Mapping) -> bool:
        if self.fired is not None or not self.trigger.matches(ev):
            return False
        self.seen += 1
        if self.seen == self.trigger.nth:
            self.fired = ev
            return True
        return False


def firing(trigger: Trigger, events: Iterable[Mapping]) -> Mapping | None:
    """The event of a recorded stream (in time order) that ``trigger`` fires on, or None
    when the stream has fewer than ``nth`` matches."""
    counter = TriggerCounter(trigger)
    return next((ev for ev in events if counter.feed(ev)), None)


def parse_trigger(f: Fields) -> Trigger:
    """A fault's ``trigger:`` mapping: ``event`` (required), ``nth`` (1), ``role`` or
    ``instance`` (whose events count; any when neither), ``delay_s`` (0)."""
    event = f.choice("event", tuple(PROTOCOL_EVENTS))
    nth = f.int("nth", 1, lo=1)
    role = f.choice("role", ROLE_NAMES) if f.has("role") else None
    instance = f.str("instance", None)
    if role is not None and instance is not None:
        raise f.error("instance", "absent when role is given (one source)", instance)
    delay = f.num("delay_s", 0.0, lo=0, unit="s")
    f.done()
    return Trigger(event, nth, role or instance, delay)
