"""Unit tests (no root) of the delay line's pure models and control protocol.

Statistical tests use fixed seeds and a stated tolerance: |measured - expected|
<= 5 standard errors, the standard error computed from the model (binomial
for random loss, the two-state Markov chain's asymptotic variance for
Gilbert-Elliott, the distribution's own moments for jitter). A correct model
fails one of them with probability below 1e-6.
"""

from __future__ import annotations

import json
import math
import random
import socket
import struct
import threading
from statistics import NormalDist, fmean, pstdev

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.errors import EmulationError, SpecError
from testbed.net.delayline import (MAX_STAMP_AGE_S, SO_TIMESTAMPNS, DelayLineControl, arrival_s,
                                   handle_control)
from testbed.net.impairments import (DelayParams, GilbertElliottLoss, HoldQueue, RandomLoss,
                                     Verdict, jitter_sample, stationary_loss_pct)

Z = 5.0  # tolerance in standard errors

# --- validation -------------------------------------------------------------------

BAD_PARAMS = [
    ({"delay_ms": -1}, "delay_ms", "-1"),
    ({"delay_ms": float("nan")}, "delay_ms", "nan"),
    ({"delay_ms": "10"}, "delay_ms", "'10'"),
    ({"jitter_ms": -0.5}, "jitter_ms", "-0.5"),
    ({"jitter_distribution": "gauss"}, "jitter_distribution", "'gauss'"),
    ({"loss_model": "bursty"}, "loss_model", "'bursty'"),
    ({"loss_pct": 100.5}, "loss_pct", "100.5"),
    ({"loss_pct": True}, "loss_pct", "True"),
    ({"loss_model": "gilbert_elliott", "ge_p_pct": -2}, "ge_p_pct", "-2"),
    ({"loss_model": "gilbert_elliott", "ge_r_pct": 101}, "ge_r_pct", "101"),
    ({"ge_bad_loss_pct": 200}, "ge_bad_loss_pct", "200"),
    ({"ge_good_loss_pct": -1}, "ge_good_loss_pct", "-1"),
    ({"reorder_pct": 150, "delay_ms": 5}, "reorder_pct", "150"),
    ({"reorder_pct": 5}, "reorder_pct", "5"),  # reordering needs a delay (the spec's rule)
    ({"duplicate_pct": 101}, "duplicate_pct", "101"),
    ({"limit_pkts": 0}, "limit_pkts", "0"),
    ({"limit_pkts": 10.5}, "limit_pkts", "10.5"),
    ({"seed": -3}, "seed", "-3"),
    ({"up": "yes"}, "up", "'yes'"),
    ({"loss_model": "gilbert_elliott", "loss_pct": 1}, "loss_pct", "1"),
    ({"ge_p_pct": 1}, "ge_p_pct", "1"),  # GE parameter with the random model
]


@pytest.mark.parametrize("kwargs, field_name, value", BAD_PARAMS)
def test_invalid_params_name_field_and_value(kwargs, field_name, value):
    """What arrives as JSON is checked by the spec's rules of a delay stage (SpecError) and
    the line's own (ValueError); either names the JSON field and the value."""
    with pytest.raises((ValueError, SpecError)) as info:
        DelayParams.from_dict(kwargs)
    message = str(info.value).removeprefix("delay line params: ")
    assert message.startswith(field_name + ":")
    assert value in message
    assert handle_control(HoldQueue(DelayParams()), json.dumps(
        {"op": "set", "params": kwargs}).encode())["ok"] is False


def test_unknown_key_and_bad_json_are_rejected():
    with pytest.raises(ValueError, match="unknown field.*delay_us"):
        DelayParams.from_dict({"delay_us": 5})
    with pytest.raises(ValueError, match="not valid JSON"):
        DelayParams.from_json("{delay_ms: 5")
    with pytest.raises(ValueError, match="JSON object"):
        DelayParams.from_json("[5]")


@st.composite
def valid_params(draw):
    ge = draw(st.booleans())
    pct = st.floats(0, 100, allow_nan=False)
    delay = draw(st.floats(0, 1e4, allow_nan=False))
    return DelayParams(
        delay_ms=delay, jitter_ms=draw(st.floats(0, 1e3, allow_nan=False)),
        jitter_distribution=draw(st.sampled_from(["uniform", "normal", "pareto", "paretonormal"])),
        loss_model="gilbert_elliott" if ge else "random",
        loss_pct=0.0 if ge else draw(pct), ge_p_pct=draw(pct) if ge else 0.0,
        ge_r_pct=draw(st.floats(0.01, 100) if ge else pct),  # GE: r > 0 (the spec's rule)
        ge_bad_loss_pct=draw(pct), ge_good_loss_pct=draw(pct),
        reorder_pct=draw(pct) if delay > 0 else 0.0,
        limit_pkts=draw(st.integers(1, 10**6)), seed=draw(st.integers(0, 2**63)),
        up=draw(st.booleans()))


@given(valid_params())
def test_json_round_trip(params):
    assert DelayParams.from_json(params.to_json()) == params
    assert DelayParams.from_dict(params.to_dict()) == params


# --- loss models ------------------------------------------------------------------

@pytest.mark.parametrize("loss_pct", [0.5, 1.0, 10.0, 50.0])
def test_random_loss_rate_within_tolerance(loss_pct):
    n, rng, model = 200_000, random.Random(3), RandomLoss(loss_pct)
    lost = sum(model.lost(rng) for _ in range(n))
    p = loss_pct / 100
    assert abs(lost / n - p) <= Z * math.sqrt(p * (1 - p) / n)


def ge_standard_error(p, r, loss_bad, loss_good, n):
    """Std error of the loss share over n frames of a stationary GE chain."""
    share_bad = p / (p + r)
    lam = 1 - p - r  # second eigenvalue of the transition matrix
    state_var = (loss_bad - loss_good) ** 2 * share_bad * (1 - share_bad) * (1 + lam) / (1 - lam)
    bernoulli_var = share_bad * loss_bad * (1 - loss_bad) + \
        (1 - share_bad) * loss_good * (1 - loss_good)
    return math.sqrt((state_var + bernoulli_var) / n)


@pytest.mark.parametrize("p, r, bad, good", [
    (1, 10, 100, 0),     # bursts of mean length 10, 9.09 % loss
    (5, 30, 60, 2),      # partial loss in both states
    (0.5, 50, 100, 0.5),
])
def test_gilbert_elliott_long_run_loss_is_stationary_loss(p, r, bad, good):
    params = DelayParams(loss_model="gilbert_elliott", ge_p_pct=p, ge_r_pct=r,
                         ge_bad_loss_pct=bad, ge_good_loss_pct=good)
    expected = (p * bad + r * good) / (p + r) / 100
    assert stationary_loss_pct(params) == pytest.approx(100 * expected)
    n, rng, model = 400_000, random.Random(5), GilbertElliottLoss(params)
    lost = sum(model.lost(rng) for _ in range(n))
    tolerance = Z * ge_standard_error(p / 100, r / 100, bad / 100, good / 100, n)
    assert abs(lost / n - expected) <= tolerance, (lost / n, expected, tolerance)


def test_gilbert_elliott_losses_come_in_bursts_of_mean_one_over_r():
    params = DelayParams(loss_model="gilbert_elliott", ge_p_pct=2, ge_r_pct=25)
    rng, model = random.Random(9), GilbertElliottLoss(params)
    bursts, run = [], 0
    for _ in range(300_000):
        if model.lost(rng):
            run += 1
        elif run:
            bursts.append(run)
            run = 0
    # burst length is geometric(r): mean 1/r = 4, std sqrt(1-r)/r
    assert abs(fmean(bursts) - 4.0) <= Z * math.sqrt(0.75) / 0.25 / math.sqrt(len(bursts))


# --- jitter -----------------------------------------------------------------------

def pareto_moments(cap=32767 / 8192):
    """Mean and std of iproute2's pareto table value: (X - 1.5) * 4/3 capped, X ~ Pareto(3)."""
    x_cap = 1.5 + 0.75 * cap
    m1 = 1.5 * (1 - x_cap ** -2) + x_cap ** -2  # E[min(X, x_cap)]
    m2 = 3 * (1 - 1 / x_cap) + 1 / x_cap  # E[min(X, x_cap)^2]
    return (m1 - 1.5) * 4 / 3, math.sqrt(m2 - m1 * m1) * 4 / 3


def paretonormal_moments(points=200_000):
    """Midpoint-rule moments of iproute2's (normal + 3 pareto) / 4 at a common quantile."""
    inv = NormalDist().inv_cdf
    values = []
    for i in range(points):
        q = (i + 0.5) / points
        par = min(((1 - q) ** (-1 / 3) - 1.5) * 4 / 3, 32767 / 8192)
        values.append((inv(q) + 3 * par) / 4)
    return fmean(values), pstdev(values)


@pytest.mark.parametrize("dist, moments", [
    ("uniform", lambda: (0.0, 1 / math.sqrt(3))),
    ("normal", lambda: (0.0, 1.0)),
    ("pareto", pareto_moments),
    ("paretonormal", paretonormal_moments),
])
def test_jitter_distribution_mean_and_std(dist, moments):
    mean, std = moments()
    n, rng = 200_000, random.Random(13)
    draws = [jitter_sample(dist, rng) for _ in range(n)]
    assert abs(fmean(draws) - mean) <= Z * std / math.sqrt(n)
    assert pstdev(draws) == pytest.approx(std, rel=0.02)


def release_delays_ms(params: DelayParams, n: int) -> list[float]:
    q = HoldQueue(params)
    delays = []
    for i in range(n):
        assert q.admit(float(i), i, 100) is Verdict.HELD
        delays.append((q.next_release_s() - i) * 1000)
        q.pop_due(math.inf)
    return delays


def test_delay_with_normal_jitter_has_that_mean_and_std():
    delays = release_delays_ms(DelayParams(delay_ms=50, jitter_ms=8,
                                           jitter_distribution="normal", seed=2), 50_000)
    assert abs(fmean(delays) - 50) <= Z * 8 / math.sqrt(len(delays))
    assert pstdev(delays) == pytest.approx(8, rel=0.02)


def test_negative_jittered_delay_is_clamped_to_zero():
    delays = release_delays_ms(DelayParams(delay_ms=1, jitter_ms=5, seed=4), 5_000)
    assert min(delays) == 0.0 and max(delays) <= 6.0


# --- ordering, reordering, limit, down ----------------------------------------------

@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.floats(0, 0.02), min_size=1, max_size=300),
       delays=st.lists(st.floats(0, 30), min_size=1, max_size=4),
       loss=st.floats(0, 50), seed=st.integers(0, 2**32))
def test_no_reordering_without_jitter_even_across_delay_changes(gaps, delays, loss, seed):
    q = HoldQueue(DelayParams(delay_ms=delays[0], loss_pct=loss, seed=seed))
    now, out = 0.0, []
    for i, gap in enumerate(gaps):
        now += gap
        if i % 50 == 49:
            q.set_params(DelayParams(delay_ms=delays[i // 50 % len(delays)], loss_pct=loss,
                                     seed=seed))
        q.admit(now, i, 100)
        out += [frame for frame, _ in q.pop_due(now + gap / 2)]
    out += [frame for frame, _ in q.pop_due(math.inf)]
    assert out == sorted(out)


def test_reorder_share_is_sent_at_once_and_overtakes():
    q = HoldQueue(DelayParams(delay_ms=10, reorder_pct=25, seed=8))
    n = 40_000
    immediate = 0
    for i in range(n):
        q.pop_due(math.inf)  # empty queue: the head is this frame's release time
        q.admit(float(i), i, 100)
        immediate += q.next_release_s() == float(i)
    share = immediate / n
    assert abs(share - 0.25) <= Z * math.sqrt(0.25 * 0.75 / n)
    q2 = HoldQueue(DelayParams(delay_ms=10, reorder_pct=25, seed=8))
    order = []
    for i in range(2_000):
        q2.admit(i * 1e-3, i, 100)
        order += [f for f, _ in q2.pop_due(i * 1e-3)]
    assert order != sorted(order)


def test_duplicate_share_holds_a_copy_with_its_own_delay_and_counts_add_up():
    q = HoldQueue(DelayParams(delay_ms=10, jitter_ms=2, duplicate_pct=10, seed=3))
    n = 20_000
    out = []
    for i in range(n):
        q.admit(i * 1e-3, i, 100)
        out += [f for f, _ in q.pop_due(i * 1e-3)]
    out += [f for f, _ in q.pop_due(math.inf)]
    st = q.stats
    copies = len(out) - n
    assert copies == st.duplicated and len(set(out)) == n  # every frame, some twice
    assert abs(copies / n - 0.10) <= Z * math.sqrt(0.10 * 0.90 / n)
    assert st.frames_in + st.duplicated == len(out) + q.held
    first, last = {}, {}
    for pos, f in enumerate(out):
        first.setdefault(f, pos)
        last[f] = pos
    apart = [last[f] - first[f] for f in first if last[f] != first[f]]
    assert len(apart) == copies and max(apart) > 1  # a copy draws its own delay


def test_a_copy_never_exceeds_the_limit():
    q = HoldQueue(DelayParams(delay_ms=10, duplicate_pct=100, limit_pkts=3))
    verdicts = [q.admit(0.0, i, 100) for i in range(3)]
    assert verdicts == [Verdict.HELD, Verdict.HELD, Verdict.DROPPED_LIMIT]
    assert q.held == 3 and q.stats.duplicated == 1  # frame 0's copy; frame 1's found no room


def test_limit_drops_frames_beyond_limit_pkts():
    q = HoldQueue(DelayParams(delay_ms=10, limit_pkts=3))
    verdicts = [q.admit(0.0, i, 100) for i in range(5)]
    assert verdicts == [Verdict.HELD] * 3 + [Verdict.DROPPED_LIMIT] * 2
    assert [f for f, _ in q.pop_due(0.010)] == [0, 1, 2]
    assert q.admit(0.011, 5, 100) is Verdict.HELD
    assert q.stats_dict()["dropped_limit"] == 2 and q.held == 1


def test_down_drops_arrivals_and_held_frames_and_up_restores():
    q = HoldQueue(DelayParams(delay_ms=10))
    q.admit(0.0, "held-before-down", 100)
    q.set_params(DelayParams(delay_ms=10, up=False))
    assert q.admit(0.001, "arrives-while-down", 100) is Verdict.DROPPED_DOWN
    assert q.pop_due(0.02) == []
    q.set_params(DelayParams(delay_ms=10, up=True))
    assert q.admit(0.03, "after-up", 100) is Verdict.HELD
    assert q.pop_due(0.04) == [("after-up", 100)]
    assert q.stats_dict()["dropped_down"] == 2


def test_set_params_keeps_release_time_of_held_frames():
    q = HoldQueue(DelayParams(delay_ms=25))
    q.admit(0.0, "old", 100)
    q.set_params(DelayParams(delay_ms=50, jitter_ms=1))
    assert q.next_release_s() == pytest.approx(0.025)


def decisions(params: DelayParams, n: int = 3_000) -> list:
    q = HoldQueue(params)
    return [(q.admit(i * 1e-4, i, 100), q.next_release_s()) for i in range(n)]


def test_same_seed_same_decisions_other_seed_differs():
    base = dict(delay_ms=20, jitter_ms=5, jitter_distribution="paretonormal",
                loss_model="gilbert_elliott", ge_p_pct=3, ge_r_pct=20, reorder_pct=5,
                limit_pkts=10**6)
    assert decisions(DelayParams(seed=42, **base)) == decisions(DelayParams(seed=42, **base))
    assert decisions(DelayParams(seed=42, **base)) != decisions(DelayParams(seed=43, **base))


# --- arrival timestamps -------------------------------------------------------------

def _stamp(sec: int, nsec: int) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, SO_TIMESTAMPNS, struct.pack("qq", sec, nsec))]


def test_arrival_is_the_kernel_stamp_on_the_monotonic_clock():
    # realtime 1000.5 s with monotonic = realtime - 900: arrived at monotonic 100.5
    assert arrival_s(_stamp(1000, 500_000_000), -900.0, read_s=100.7) == pytest.approx(100.5)
    # a stamp a hair after the read (the two clocks read a moment apart) is the read
    assert arrival_s(_stamp(1000, 700_500_000), -900.0, read_s=100.7) == pytest.approx(100.7)


@pytest.mark.parametrize("anc, read_s", [
    ([], 100.0),  # no control message: the kernel gave no stamp
    ([(socket.SOL_SOCKET, SO_TIMESTAMPNS + 1, struct.pack("qq", 100, 0))], 100.0),  # another
    ([(socket.SOL_SOCKET, SO_TIMESTAMPNS, b"\0" * 4)], 100.0),  # truncated
    (_stamp(1000, 0), 100.0 + MAX_STAMP_AGE_S + 0.5),  # too old to be this frame's arrival
    (_stamp(1000, 10_000_000), 99.5),  # after the read: another clock
])
def test_an_unusable_stamp_gives_none(anc, read_s):
    assert arrival_s(anc, -900.0, read_s=read_s) is None


# --- control protocol ---------------------------------------------------------------

def test_handle_control_stats_set_and_errors():
    q = HoldQueue(DelayParams())
    stats = handle_control(q, b'{"op": "stats"}')
    assert stats == {"ok": True, "frames_in": 0, "frames_out": 0, "bytes_in": 0, "bytes_out": 0,
                     "dropped_loss": 0, "dropped_limit": 0, "dropped_down": 0,
                     "dropped_tx": 0, "dropped_kernel": 0, "duplicated": 0, "unstamped": 0,
                     "realtime": False,
                     "held": 0,
                     "lateness": {"n": 0, "sum_ms": 0.0, "max_ms": 0.0, "counts": {}}}
    assert handle_control(q, b'{"op": "set", "params": {"delay_ms": 7}}') == {"ok": True}
    assert q.params == DelayParams(delay_ms=7)
    bad = handle_control(q, b'{"op": "set", "params": {"loss_pct": 300}}')
    assert bad["ok"] is False and "loss_pct" in bad["error"]
    assert q.params == DelayParams(delay_ms=7)  # unchanged
    for msg in (b"not json", b"[1]", b'{"op": "reboot"}', b"\xff"):
        assert handle_control(q, msg)["ok"] is False


def serve(sock: socket.socket, queue: HoldQueue, answers: int) -> None:
    for _ in range(answers):
        data, addr = sock.recvfrom(65536)
        sock.sendto(json.dumps(handle_control(queue, data)).encode(), addr)


def test_control_client_round_trip_leaves_no_files(tmp_path):
    path = str(tmp_path / "line.sock")
    queue = HoldQueue(DelayParams())
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        thread = threading.Thread(target=serve, args=(server, queue, 2))
        thread.start()
        ctl = DelayLineControl(path, timeout_s=5)
        ctl.set(DelayParams(delay_ms=12.5, seed=3))
        assert ctl.stats()["held"] == 0
        thread.join(5)
    assert queue.params == DelayParams(delay_ms=12.5, seed=3)
    assert [p.name for p in tmp_path.iterdir()] == ["line.sock"]
    (tmp_path / "line.sock").unlink()


def test_control_client_times_out_clearly(tmp_path):
    path = str(tmp_path / "silent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind(path)
        with pytest.raises(EmulationError, match="did not answer 'stats' within 0.2 s"):
            DelayLineControl(path, timeout_s=0.2).stats()
    assert [p.name for p in tmp_path.iterdir()] == ["silent.sock"]
    (tmp_path / "silent.sock").unlink()
    with pytest.raises(EmulationError, match="cannot reach"):
        DelayLineControl(str(tmp_path / "absent.sock"), timeout_s=0.2).stats()


def test_lateness_is_each_sent_frames_send_time_minus_its_release_time():
    q = HoldQueue(DelayParams(delay_ms=10))
    q.admit(0.0, "a", 100)
    q.admit(0.001, "b", 100)
    q.admit(0.002, "c", 100)
    due = q.pop_due(0.0115)  # a and b are due (release 0.010, 0.011)
    assert [f for f, _ in due] == ["a", "b"]
    q.record_sent(100, sent_s=0.0120)  # a: 2.0 ms late
    q.record_tx_error()  # b refused: no lateness, the next record is c's
    q.pop_due(0.0125)
    q.record_sent(100, sent_s=0.0121)  # c: released at 0.012, 0.1 ms late
    late = q.stats_dict()["lateness"]
    assert late["n"] == 2
    assert late["max_ms"] == pytest.approx(2.0)
    assert late["sum_ms"] == pytest.approx(2.1)
