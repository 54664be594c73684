"""links.csv rows are timed per counter read, so a rate between two rows is the link's.

A fake network: each channel's counter read takes a varying time on a fake
clock (as reads into one namespace after another do on a loaded machine)
while the WAN carries exactly its shaper's rate. The rates computed from the
rows must be that rate; with one timestamp for the whole sample (the old
sampler) they came out up to 1.4x the shaper's.
"""

from __future__ import annotations

import csv
import json
import random
from types import SimpleNamespace

from testbed.report.metrics import shaper_rate_ratios
from testbed.report.rundir import LinkSample
from testbed.scenario import sampler as sampler_mod

RATE_GBIT = 0.4  # emulated: the 10 Gbit/s WAN at k=25


class Clock:
    def __init__(self):
        self.t = 100.0

    def monotonic(self):
        return self.t


def _fake_net(clock, rng):
    htb = SimpleNamespace(emulated_gbit=RATE_GBIT)
    spec = SimpleNamespace(rate_gbit=10.0)
    names = ["host:p1/up", "host:rld1/up", "host:md1/up", "wan/b>a", "wan/a>b"]
    channels = {cid: SimpleNamespace(link=cid.split("/")[0], direction=cid.split("/")[1],
                                     spec=spec, htb=htb) for cid in names}

    def channel_counter(net, cid):
        # the kernel reads the counter somewhere inside a read of 5-150 ms
        before = rng.uniform(0.002, 0.075)
        clock.t += before
        at = clock.t
        clock.t += rng.uniform(0.002, 0.075)
        carried = RATE_GBIT * 1e9 / 8 * at if cid.startswith("wan") else 0
        return {"bytes": int(carried), "packets": 0, "drops": 0}

    return SimpleNamespace(channels=channels), channel_counter


def _rows(path):
    with path.open() as fh:
        return [LinkSample(float(r["t_mono"]), r["link"], r["direction"], int(r["bytes"]),
                           int(r["packets"]), int(r["drops"]), float(r["nominal_rate_gbit"]),
                           float(r["emulated_rate_gbit"])) for r in csv.DictReader(fh)]


def test_rates_between_rows_are_the_shapers_whatever_each_read_costs(tmp_path, monkeypatch):
    clock, rng = Clock(), random.Random(7)
    net, counter = _fake_net(clock, rng)
    monkeypatch.setattr(sampler_mod.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(sampler_mod.runtime, "channel_counter", counter)
    s = sampler_mod.LinkSampler(net, tmp_path / "links.csv")
    for _ in range(40):
        s.sample()
        clock.t += 0.5 - 0.1 * rng.random()  # the runner's loop, late by up to 0.1 s
    s.close()
    ratios = [r for _, _, r in shaper_rate_ratios(_rows(tmp_path / "links.csv"))]
    assert len(ratios) == 2 * 39
    # the midpoint is at most half a read (<= 75 ms) from the counter's moment, over >= 0.4 s
    assert max(ratios) < 1.2 and min(ratios) > 0.8
    with (tmp_path / "links.csv").open() as fh:
        assert all(float(r["read_s"]) > 0 for r in csv.DictReader(fh))


def test_one_timestamp_per_sample_overstates_the_rate():
    """The failure the per-read times fix, on the same fake: the check can fail."""
    clock, rng = Clock(), random.Random(7)
    net, counter = _fake_net(clock, rng)
    rows = []
    for _ in range(40):
        t = clock.monotonic()  # the old sampler: one time, then every channel's read
        for cid, ch in net.channels.items():
            c = counter(net, cid)
            rows.append(LinkSample(t, ch.link, ch.direction, c["bytes"], 0, 0, 10.0, RATE_GBIT))
        clock.t += 0.5 - 0.1 * rng.random()
    assert max(r for _, _, r in shaper_rate_ratios(rows)) > 1.2


def test_shaper_ratio_uses_the_higher_rate_of_a_change_and_skips_short_intervals():
    rows = [LinkSample(0.0, "wan", "a>b", 0, 0, 0, 10.0, 0.4),
            LinkSample(0.1, "wan", "a>b", 10_000_000, 0, 0, 10.0, 0.4),   # too close: skipped
            LinkSample(0.5, "wan", "a>b", 25_000_000, 0, 0, 10.0, 0.8),   # rate raised
            LinkSample(1.0, "wan", "a>b", 75_000_000, 0, 0, 10.0, 0.8),
            LinkSample(1.0, "host:p1", "up", 10**12, 0, 0, 100.0, 4.0)]  # another link
    got = shaper_rate_ratios(rows)
    assert [(t, d) for t, d, _ in got] == [(0.5, "a>b"), (1.0, "a>b")]
    assert abs(got[0][2] - 25e6 * 8 / 0.5 / 0.8e9) < 1e-9  # 0.5: against 0.8, the higher
    assert abs(got[1][2] - 1.0) < 1e-9


def test_the_host_sampler_records_each_cores_steal_apart_from_its_busy_time(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    # user nice system idle iowait irq softirq steal (the aggregate "cpu" line is skipped)
    (proc / "stat").write_text("cpu  30 0 6 200 4 0 2 9\n"
                               "cpu0 10 0 2 100 4 0 1 7\n"
                               "cpu1 20 0 4 100 0 0 1 2\n"
                               "intr 12345\n")
    (proc / "meminfo").write_text("MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\n")
    host = sampler_mod.HostSampler(tmp_path / "host.jsonl", proc=proc)
    host.sample()
    host.close()
    row = json.loads((tmp_path / "host.jsonl").read_text())
    assert row["cpu_busy"] == [20, 27]  # all but idle and iowait, steal included
    assert row["cpu_total"] == [124, 127]
    assert row["cpu_steal"] == [7, 2]
    assert (row["mem_used_bytes"], row["mem_total_bytes"]) == (600 * 1024, 1000 * 1024)


def test_a_kernel_without_a_steal_column_reads_as_none_stolen():
    assert sampler_mod.read_proc_stat("cpu0 10 0 2 100 4 0 1\n") == ([13], [117], [0])
