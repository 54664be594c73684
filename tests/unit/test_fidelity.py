"""The fidelity verdict from synthetic figures and synthetic run-directory files."""

from __future__ import annotations

import json
import math

import pytest

from testbed.histogram import LatencyHistogram
from testbed.report import fidelity as F
from testbed.report.rundir import LinkSample

TOPO = {"wan": {"a_to_b": {"delay_ms": 20.0, "jitter_ms": 0.0},
                "b_to_a": {"delay_ms": 20.0, "jitter_ms": 0.0}},
        "datacenters": [{"hosts": [{"name": "p1", "roles": ["prefill"]},
                                   {"name": "client", "roles": ["client"]}]},
                        {"hosts": [{"name": "md1", "roles": ["main_decode"]}]}]}
WINDOW = (100.0, 110.0)


def faithful_figures() -> dict:
    return {"network": {"delay_lines": {"wan/a>b": {"frames": 10_000, "lateness_p50_ms": 0.1,
                                                    "lateness_p99_ms": 0.6, "unexplained_drops": 0,
                                                    "unanswered": 0}},
                        "rtt": {"probes": 50, "excess_p50_ms": 0.4, "configured_jitter_ms": 0.0},
                        "shapers": {"wan/a>b": {"backlogged_s": 5.0, "delivered_ratio": 0.99}}},
            "compute": {"roles": {"md1": {"steps": 1000, "overrun_step_share": 0.02,
                                          "overrun_time_share": 0.01, "loop_lag_p99_ms": 1.0}}},
            "host": {"cpu_busy_share": [0.4, 0.5], "mem_peak_share": 0.1}}


def test_faithful_figures_give_no_reason():
    assert F.judge(faithful_figures()) == []


@pytest.mark.parametrize("path, value, words", [
    (("network", "delay_lines", "wan/a>b", "lateness_p99_ms"), 2.7, "delay line wan/a>b lateness p99 2.70 ms"),
    (("network", "delay_lines", "wan/a>b", "unexplained_drops"), 5, "5 drops no configured loss"),
    (("network", "delay_lines", "wan/a>b", "unanswered"), 1, "unanswered"),
    (("network", "rtt", "excess_p50_ms"), 3.5, "live RTT excess p50 +3.50 ms"),
    (("network", "rtt", "excess_p50_ms"), -3.5, "live RTT excess p50 -3.50 ms"),
    (("network", "shapers", "wan/a>b", "delivered_ratio"), 0.80, "shaper wan/a>b delivered 80.0%"),
    (("compute", "roles", "md1", "overrun_time_share"), 0.12, "md1 overran its modeled time by 12.0%"),
    (("compute", "roles", "md1", "loop_lag_p99_ms"), 21.0, "md1 event loop lag p99 21.0 ms"),
    (("host", "cpu_busy_share"), [1.0, 0.99], "busiest core 100% busy"),
    (("host", "mem_peak_share"), 0.95, "peak memory 95%"),
])
def test_each_figure_past_its_tolerance_is_named(path, value, words):
    fig = faithful_figures()
    d = fig
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    reasons = F.judge(fig)
    assert len(reasons) == 1 and words in reasons[0], reasons


def test_a_short_backlog_and_configured_jitter_do_not_judge():
    fig = faithful_figures()
    fig["network"]["shapers"]["wan/a>b"] = {"backlogged_s": 1.0, "delivered_ratio": 0.5}
    fig["network"]["rtt"].update(excess_p50_ms=4.0, configured_jitter_ms=5.0)
    assert F.judge(fig) == []


def _hist(*values) -> dict:
    h = LatencyHistogram()
    for v in values:
        h.add_ms(v)
    return h.to_dict()


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _stats(t, pid, steps, overruns, overrun_s, modeled_s, lag):
    return {"t_mono": t, "pid": pid, "name": "md1", "role": "main_decode",
            "pacer": {"n_steps": steps, "n_overruns": overruns, "overrun_s": overrun_s,
                      "modeled_s": modeled_s}, "loop_lag": lag}


def test_role_figures_count_only_the_window_and_sum_a_restarted_instance(tmp_path):
    rows = [_stats(90.0, 1, 500, 400, 50.0, 60.0, _hist(*[100.0] * 50)),  # warm-up: not counted
            _stats(99.5, 1, 600, 400, 50.0, 70.0, _hist(*[100.0] * 50, 1.0)),
            _stats(104.0, 1, 700, 410, 51.0, 80.0, _hist(*[100.0] * 50, *[1.0] * 100)),
            _stats(105.0, 2, 0, 0, 0.0, 0.0, _hist()),  # restarted: a new pid from zero
            _stats(110.5, 2, 100, 0, 0.0, 10.0, _hist(*[1.0] * 100))]
    fig = F.role_figures(rows, WINDOW)
    assert fig["processes"] == 2
    assert fig["steps"] == 200  # 100 + 100: the warm-up's 600 are before the window
    assert fig["overrun_time_share"] == pytest.approx(1.0 / 20.0)
    assert fig["overrun_step_share"] == pytest.approx(10 / 200)
    assert fig["loop_lag_p99_ms"] < 2.0  # the warm-up's 100 ms lags are outside
    assert F.judge({"compute": {"roles": {"md1": fig}}}) == []


def test_delay_lines_host_ping_and_shapers_from_files(tmp_path):
    d = tmp_path / "pdd"
    line = {"frames_in": 0, "frames_out": 0, "dropped_kernel": 0, "dropped_tx": 0}
    _write(d / "delaylines.jsonl", [
        {"t_mono": 99.0, "channel": "wan/a>b", **line, "lateness": _hist(50.0)},
        {"t_mono": 110.2, "channel": "wan/a>b", **line, "frames_in": 1001, "dropped_kernel": 1,
         "lateness": _hist(50.0, *[0.2] * 1000)},
        {"t_mono": 105.0, "channel": "wan/b>a", "unanswered": True}])
    _write(d / "host.jsonl", [
        {"t_mono": 99.9, "cpu_busy": [100, 0], "cpu_total": [1000, 1000], "mem_used_bytes": 10,
         "mem_total_bytes": 100},
        {"t_mono": 105.0, "cpu_busy": [500, 900], "cpu_total": [1500, 1500],
         "mem_used_bytes": 93, "mem_total_bytes": 100},
        {"t_mono": 110.1, "cpu_busy": [600, 1000], "cpu_total": [2000, 2000],
         "mem_used_bytes": 20, "mem_total_bytes": 100}])
    _write(d / "roles" / "md1.stats.jsonl", [_stats(99.0, 1, 0, 0, 0.0, 0.0, _hist()),
                                             _stats(111.0, 1, 10, 0, 0.0, 1.0, _hist(0.5))])
    offset = 100.0 - 1.7e9  # t_mono - t_wall
    events = [{"kind": "workload_start", "t_mono": 100.0, "t_wall": 100.0 - offset},
              {"kind": "workload_end", "t_mono": 110.0, "t_wall": 110.0 - offset}]
    # 10 replies: 40.3 ms with empty queues; 2 at 48 ms while a>b holds 400 KB at 0.4 Gbit/s
    # (8 ms of queueing the backlog explains)
    ping = ["PING 10.77.2.10 (10.77.2.10) 56(84) bytes of data."]
    for i in range(10):
        rtt = 48.3 if i in (4, 5) else 40.3
        ping.append(f"[{100.5 + i - offset:.6f}] 64 bytes from 10.77.2.10: icmp_seq={i} "
                    f"ttl=62 time={rtt} ms")
    (d / "ping.txt").write_text("\n".join(ping) + "\n")
    links = [LinkSample(100.0 + i, "wan", "a>b", int(i * 0.4e9 / 8), 0, 0, 10.0, 0.4,
                        400_000 if i in (4, 5, 6) else 0) for i in range(11)]
    fid = F.mode_fidelity(d, events, links, TOPO, WINDOW, F.probe_hosts(TOPO))
    net = fid["network"]
    ab = net["delay_lines"]["wan/a>b"]
    assert ab["frames"] == 1001 and ab["unexplained_drops"] == 1
    assert ab["lateness_p99_ms"] < 0.3  # the 50 ms before the window is not in it
    assert net["delay_lines"]["wan/b>a"] == {"unanswered": 1}
    assert net["rtt"]["probes"] == 10
    assert net["rtt"]["excess_p50_ms"] == pytest.approx(0.3)
    assert net["rtt"]["excess_p99_ms"] == pytest.approx(0.3)  # the queueing is removed
    # 400 KB is 8 ms of the 0.4 Gbit/s shaper's work: no 1 s interval shows it busy
    assert "wan/a>b" not in net["shapers"]
    assert fid["host"] == {"cpu_busy_share": [0.5, 1.0], "mem_peak_bytes": 93,
                           "mem_peak_share": 0.93}
    assert fid["verdict"] == "degraded"
    assert any("unanswered" in r for r in fid["reasons"])
    assert any("busiest core 100% busy" in r for r in fid["reasons"])
    assert any("peak memory 93%" in r for r in fid["reasons"])
    run = F.combine({"pdd": fid, "cross-dc-pd": {**fid, "verdict": "faithful", "reasons": []}},
                    "strict")
    assert run["verdict"] == "degraded" and run["policy"] == "strict"
    assert all(r.startswith("pdd: ") for r in run["reasons"])


def test_steal_is_shown_per_core_with_its_worst_interval_and_judges_nothing():
    def row(t, steal, total):
        return {"t_mono": t, "cpu_busy": [total // 2] * 2, "cpu_total": [total] * 2,
                "cpu_steal": steal, "mem_used_bytes": 1, "mem_total_bytes": 100}
    rows = [row(99.0, [0, 0], 0), row(99.8, [50, 0], 100),  # 50% stolen, before the window
            row(105.0, [52, 1], 600), row(107.5, [53, 61], 850),  # core 1: 60 of 250
            row(110.5, [54, 62], 1150)]
    host = F.host_figures(rows, WINDOW)
    # from 99.8 (the last row before the window) to 110.5: core 0 lost 4 of 1050 jiffies,
    # core 1 62 of 1050
    assert host["cpu_steal_share"] == [round(4 / 1050, 4), round(62 / 1050, 4)]
    assert host["cpu_steal_worst_share"] == 0.24 and host["cpu_steal_worst_at_s"] == 7.5
    fig = faithful_figures()
    fig["host"].update(cpu_steal_share=[0.3, 0.3], cpu_steal_worst_share=1.0)
    assert F.judge(fig) == []


def test_the_run_names_the_mode_that_lost_most_to_steal_and_notes_it_only_when_degraded():
    def mode(verdict, steal, worst):
        return {"verdict": verdict, "reasons": ["x"] if verdict == "degraded" else [],
                "host": {"cpu_busy_share": [0.3, 0.3], "cpu_steal_share": steal,
                         "cpu_steal_worst_share": worst}}
    run = F.combine({"pdd": mode("degraded", [0.04, 0.05], 0.21),
                     "cross-dc-pd": mode("faithful", [0.006, 0.007], 0.42)})
    assert run["host_steal"] == {"share": 0.045, "mode": "pdd", "worst_share": 0.42}
    assert F.steal_line(run).startswith("host: the hypervisor took 4.5% of the cores' time in "
                                        "pdd (steal; worst core over one sample 42%)")
    calm = F.combine({"pdd": mode("degraded", [0.005, 0.006], 0.05)})
    assert F.steal_line(calm) is None  # under 1%: the run's own load is the likelier cause
    fine = F.combine({"pdd": mode("faithful", [0.04, 0.05], 0.21)})
    assert F.steal_line(fine) is None
    older = F.combine({"pdd": {"verdict": "degraded", "reasons": ["x"],
                               "host": {"cpu_busy_share": [0.9]}}})
    assert older["host_steal"] is None and F.steal_line(older) is None


def test_a_run_directory_without_fidelity_files_has_no_verdict(tmp_path):
    fid = F.mode_fidelity(tmp_path, [], [], TOPO, None, None)
    assert fid["verdict"] is None and fid["reasons"] == []
    assert F.combine({"pdd": fid})["verdict"] is None


def test_configured_delays_follow_the_wans_set_link_events():
    events = [{"kind": "set_link", "channel": "wan/a>b", "t_mono": 5.0, "delay_ms": 50.0},
              {"kind": "set_link", "channel": "host:p1/up", "t_mono": 6.0, "delay_ms": 9.0},
              {"kind": "set_link", "channel": "wan/b>a", "t_mono": 7.0, "jitter_ms": 2.0}]
    series = F.configured_delays(TOPO, events)
    assert [(t, rtt, j) for t, rtt, j in series[1:]] == [(5.0, 70.0, 0.0), (7.0, 70.0, 2.0)]
    assert F._at(series, 1.0)[1] == 40.0 and F._at(series, 6.0)[1] == 70.0


def _dl(t, tx, frames=1000):
    return {"t_mono": t, "channel": "wan/a>b", "frames_in": frames, "frames_out": frames - tx,
            "dropped_kernel": 0, "dropped_tx": tx, "lateness": _hist()}


def test_drops_while_the_link_was_down_are_the_flaps_not_unexplained():
    # samples each second; the link is down from 102.5 to 104.2: the interval 102-103
    # (20 drops) and 104-105 (5) overlap it; 106-107 (3 drops) does not
    rows = [_dl(100, 0), _dl(101, 0), _dl(102, 0), _dl(103, 20), _dl(104, 20), _dl(105, 25),
            _dl(106, 25), _dl(107, 28)]
    events = [{"kind": "link_down", "link": "wan", "t_mono": 102.5},
              {"kind": "link_up", "link": "wan", "t_mono": 104.2},
              {"kind": "link_down", "link": "host:md1", "t_mono": 106.2}]  # another link's
    assert F.down_windows(events) == {"wan": [(102.5, 104.2)], "host:md1": [(106.2, math.inf)]}
    figs = F.delay_line_figures(rows, None, events)
    assert figs["wan/a>b"]["unexplained_drops"] == 3
    assert F.delay_line_figures(rows, None)["wan/a>b"]["unexplained_drops"] == 28


def test_a_shaper_interval_across_a_rate_change_is_not_judged():
    # 0.08 Gbit/s delivered while backlogged, then the rate steps up to 1.0 Gbit/s 0.1 s
    # before a read: that interval delivered 0.176 Gbit/s against either rate
    rate = [0.08] * 6 + [1.0] * 3
    got = [0.08] * 5 + [0.176, 1.0, 1.0]
    total, links = 0, []
    for i in range(9):
        links.append(LinkSample(100.0 + 0.5 * i, "wan", "a>b", int(total), 0, 0, 8.0 * rate[i] / 0.08,
                                rate[i], 70_000_000))  # more than 0.5 s of either rate
        if i < 8:
            total += got[i] * 1e9 / 8 * 0.5
    fig = F.shaper_figures(links, None)["wan/a>b"]
    assert fig == {"backlogged_s": 3.5, "delivered_ratio": 1.0}


def test_a_shaper_interval_that_must_have_idled_is_not_judged():
    # 1 Gbit/s; 136 KB queued at one read, 1.16 MB at the next, 9.6 MB sent between: less
    # work than the 62.5 MB the rate could send in 0.5 s, so the queue emptied inside
    idle = [LinkSample(100.0, "wan", "a>b", 0, 0, 0, 100.0, 1.0, 136_000),
            LinkSample(100.5, "wan", "a>b", 9_600_000, 6400, 0, 100.0, 1.0, 1_160_000)]
    assert F.shaper_figures(idle, None) == {}
    # a slow shaper under load: it sent half its rate and dropped the rest at a full queue
    slow = [LinkSample(100.0, "wan", "a>b", 0, 0, 0, 100.0, 1.0, 3_000_000),
            LinkSample(100.5, "wan", "a>b", 31_250_000, 20_833, 20_000, 100.0, 1.0, 3_000_000)]
    assert F.shaper_figures(slow, None)["wan/a>b"] == {"backlogged_s": 0.5,
                                                       "delivered_ratio": 0.5}
    # a burst late in the interval (a faithful run at 0.08 Gbit/s, 10 MB/s): 0.8 MB queued
    # at one read, 8 MB at the next, 1.4 MB sent, nothing dropped: the 0.8 MB lasted
    # 80 ms of the 0.5 s, so the queue may have been empty until the burst came
    late = [LinkSample(100.0, "wan", "a>b", 0, 0, 0, 8.0, 0.08, 800_000),
            LinkSample(100.5, "wan", "a>b", 1_400_000, 1000, 0, 8.0, 0.08, 8_000_000),
            LinkSample(101.0, "wan", "a>b", 6_400_000, 4400, 0, 8.0, 0.08, 3_000_000)]
    assert F.shaper_figures(late, None)["wan/a>b"] == {"backlogged_s": 0.5,
                                                       "delivered_ratio": 1.0}
    # the same queue at a shaper that sends half its rate: the second interval shows it
    slow_late = late[:2] + [LinkSample(101.0, "wan", "a>b", 3_900_000, 2700, 0, 8.0, 0.08,
                                       5_500_000)]
    assert F.shaper_figures(slow_late, None)["wan/a>b"]["delivered_ratio"] == 0.5


def test_a_packet_or_two_at_each_read_is_not_a_backlog():
    # one small packet at each read (111 and 66 bytes: what a netem delay queue held when
    # netem was the htb class's leaf), a few KB sent, and drops that would make the
    # interval's work exceed the rate: a shaper judged on it would read 4.8%
    tiny = [LinkSample(100.0, "wan", "a>b", 0, 0, 0, 0.1, 0.001, 111),
            LinkSample(100.5, "wan", "a>b", 3_000, 2, 60, 0.1, 0.001, 66)]
    assert F.shaper_figures(tiny, None) == {}
    # three full frames at each read is a queue: the same interval is judged
    queued = [s._replace(backlog_bytes=3 * 1514) for s in tiny]
    assert F.shaper_figures(queued, None)["wan/a>b"] == {"backlogged_s": 0.5,
                                                         "delivered_ratio": 0.048}


def test_the_rtt_excess_is_what_the_host_added_under_load_not_at_idle():
    # a software-emulated guest: 43 ms at the preflight for 40 configured (the VM's 3 ms
    # per round trip), and the same 43 ms under load: nothing added under load
    offset = 100.0 - 1.7e9
    events = [{"kind": "preflight", "t_mono": 90.0, "rtt_configured_ms": 40.0,
               "rtt_measured_ms": 43.0, "tolerance_ms": 10.0, "passed": True},
              {"kind": "workload_start", "t_mono": 100.0, "t_wall": 100.0 - offset}]
    ping = "".join(f"[{100.5 + i - offset:.6f}] 64 bytes from 10.77.2.10: icmp_seq={i} "
                   f"ttl=62 time={43.0 + (5.0 if i == 9 else 0.0)} ms\n" for i in range(10))
    fig = F.rtt_figures(ping, events, [], TOPO, None, None)
    assert fig["idle_excess_ms"] == pytest.approx(3.0)
    assert fig["excess_p50_ms"] == pytest.approx(0.0) and fig["excess_p99_ms"] == pytest.approx(5.0)
    assert not [r for r in F.judge({"network": {"rtt": fig}}) if "RTT" in r]
    # without a preflight (an older run) the whole offset counts, as before
    old = F.rtt_figures(ping, events[1:], [], TOPO, None, None)
    assert old["idle_excess_ms"] == 0.0 and old["excess_p50_ms"] == pytest.approx(3.0)
    assert [r for r in F.judge({"network": {"rtt": old}}) if "RTT" in r]
