"""WanModel: the router's queue-aware WAN view (pure; driven with made-up samples)."""

import pytest

from testbed.pdd.roles.wan_model import WanModel, ps_finish_s, rr_finish_s

GB = 1e9


def model(**kw):
    kw.setdefault("window_min_s", 0.2)
    return WanModel(line_gbit=10.0, prior_rtt_s=0.04, **kw)


def feed_rate(wan, t0, t1, gbit, step=0.05):
    t = t0
    while t < t1 + 1e-9:
        wan.add_rate_sample(t, gbit * 1e9 / 8 * step, step, busy=True)
        t += step


def test_idle_prediction_is_size_over_rate_plus_rtts():
    wan = model()
    p = wan.predict(0.0, 1.25 * GB, 0.0)  # 10 Gbit at 10 Gbit/s
    assert p.wan_s == pytest.approx(1.0 + 1.5 * 0.04)
    assert p.backlog_bytes == 0 and p.backlog_transfers == 0


def test_backlog_raises_the_prediction():
    wan = model()
    before = wan.predict(0.0, 0.25 * GB, 0.0).wan_s
    wan.commit(1, 2.5 * GB, 0.0)  # a big transfer already under way
    after = wan.predict(0.0, 0.25 * GB, 0.0)
    # processor sharing: the small one shares the link with the big one for its whole life
    assert after.wan_s == pytest.approx(2 * 0.2 + 0.06)
    assert after.wan_s > before
    assert after.backlog_bytes == pytest.approx(2.5 * GB)
    # the queued transfer finishing removes its delay
    wan.done(1)
    assert wan.predict(0.0, 0.25 * GB, 0.0).wan_s == pytest.approx(before)


def test_progress_updates_remaining_bytes():
    wan = model()
    wan.commit(1, 2.5 * GB, 0.0)
    wan.progress(1, 0.05 * GB, 1.9)
    p = wan.predict(2.0, 0.25 * GB, 2.0)
    # 0.05 GB shared (0.08 s for both), then the rest alone
    assert p.wan_s == pytest.approx((0.1 + 0.2) / 1.25 + 0.06)


def test_transfer_starting_after_mine_finishes_does_not_delay_me():
    wan = model()
    wan.commit(1, 2.5 * GB, 5.0)
    assert wan.predict(0.0, 0.25 * GB, 0.0).wan_s == pytest.approx(0.2 + 0.06)


def test_rate_dip_is_followed_within_the_window():
    wan = model(window_min_s=0.2, window_rtts=5)
    feed_rate(wan, 0.0, 2.0, 10.0)
    assert wan.capacity_gbit(2.0) == pytest.approx(10.0)
    feed_rate(wan, 2.05, 2.5, 0.7)  # the WAN drops to 0.7 Gbit/s
    # window = max(0.2 s, 5 x 40 ms) = 0.2 s: 4 samples after the dip
    assert wan.capacity_gbit(2.25) == pytest.approx(0.7)
    feed_rate(wan, 2.55, 3.0, 10.0)  # and comes back: the max follows at once
    assert wan.capacity_gbit(3.0) == pytest.approx(10.0)


def test_cross_traffic_share_lowers_the_estimate():
    wan = model()
    feed_rate(wan, 0.0, 1.0, 10.0)
    feed_rate(wan, 1.05, 2.0, 10.0 / 17)  # 16 cross flows: our connection gets 1/17
    assert wan.capacity_gbit(2.0) == pytest.approx(10.0 / 17)
    assert wan.predict(2.0, 1.25 * GB, 2.0).wan_s > 10


def test_bursts_above_the_line_rate_are_capped_and_averaged():
    wan = model()
    for i, gbit in enumerate([25.0, 2.0, 25.0, 0.0]):  # MD read in bursts
        wan.add_rate_sample(1.0 + i * 0.05, gbit * 1e9 / 8 * 0.05, 0.05, busy=True)
    assert wan.capacity_gbit(1.15) == pytest.approx(10.0)  # mean 13, capped at the line
    for t in (1.2, 1.25, 1.3):  # three empty busy intervals: the mean falls below the line
        wan.add_rate_sample(t, 0.0, 0.05, busy=True)
    assert wan.capacity_gbit(1.3) == pytest.approx(25.0 / 5)  # [1.1, 1.3]: 25, 0, 0, 0, 0


def test_idle_intervals_are_not_rate_samples():
    wan = model()
    feed_rate(wan, 0.0, 1.0, 8.0)
    assert not wan.add_rate_sample(1.05, 0, 0.05, busy=False)
    assert wan.capacity_age_s(1.1) == 0.0  # the window still holds busy samples
    assert wan.capacity_gbit(5.0) == pytest.approx(8.0)  # held, not decayed to 0
    assert wan.capacity_age_s(5.0) == pytest.approx(4.0)


def test_a_stalled_windows_estimate_is_held_but_recovers_for_the_optimistic_view():
    # loss.yaml, 2026-12-02 (commit 72ba382): a window of stalled intervals set the
    # estimate to 0, later requests went rld-only, nothing crossed the WAN, and the 0
    # stayed for good
    wan = model(recovery_half_life_s=2.0)
    feed_rate(wan, 0.0, 1.0, 0.0)  # a transfer in progress, nothing delivered
    assert wan.capacity_gbit(1.0) == wan.recovered_gbit(1.0) == 0.0
    assert wan.predict(1.0, 0.1 * GB, 1.0, optimistic=True).wan_s > 100
    # the window (0.2 s) empties; one half-life after the newest sample: half the line
    assert wan.capacity_age_s(3.0) == pytest.approx(2.0)
    assert wan.recovered_gbit(3.0) == pytest.approx(5.0)
    assert wan.recovered_gbit(7.0) == pytest.approx(10.0 - 10.0 / 8)  # three half-lives
    assert wan.capacity_gbit(7.0) == 0.0  # the held estimate: the p-md / relay decision's
    assert wan.predict(7.0, 0.1 * GB, 7.0).wan_s > 100
    p = wan.predict(7.0, 0.1 * GB, 7.0, optimistic=True)
    assert p.wan_s < 1.0 and p.capacity_age_s == pytest.approx(6.0)
    assert p.capacity_gbit == pytest.approx(10.0 - 10.0 / 8)


def test_an_outage_that_goes_on_keeps_even_the_optimistic_estimate_at_zero():
    wan = model(recovery_half_life_s=2.0)
    feed_rate(wan, 0.0, 10.0, 0.0)  # busy throughout, 0 bytes: no recovery while measured
    assert wan.recovered_gbit(10.0) == 0.0 and wan.capacity_age_s(10.0) == 0.0


def test_a_recovering_estimate_follows_the_next_measurement_at_once():
    wan = model(recovery_half_life_s=2.0)
    feed_rate(wan, 0.0, 1.0, 0.7)  # a dip, then idle
    assert wan.recovered_gbit(5.0) > 7.0  # recovered most of the way toward 10
    feed_rate(wan, 5.0, 5.3, 0.7)  # a transfer still sees 0.7: the estimate is 0.7 again
    assert wan.recovered_gbit(5.3) == pytest.approx(0.7)


def test_a_short_transfer_faster_than_a_held_estimate_raises_it():
    # BBR's rule for application-limited samples: used only when above the estimate
    wan = model()
    feed_rate(wan, 0.0, 1.0, 0.7)  # a dip, then the line is back but nothing is busy
    assert wan.capacity_gbit(2.0) == pytest.approx(0.7)
    # 50 MB nominal in a 0.1 s interval that was not busy throughout: >= 4 Gbit/s
    assert wan.add_rate_sample(2.0, 50e6, 0.1, busy=False)
    assert wan.capacity_gbit(2.0) == pytest.approx(4.0)
    assert not wan.add_rate_sample(2.1, 10e6, 0.1, busy=False)  # slower: no lower bound
    assert wan.capacity_gbit(2.1) == pytest.approx(4.0)
    assert wan.add_rate_sample(2.2, 500e6, 0.1, busy=False)  # a read burst: capped
    assert wan.capacity_gbit(2.2) == pytest.approx(10.0)
    # while busy intervals are in the window they alone set the estimate
    feed_rate(wan, 3.0, 3.3, 1.5)
    assert not wan.add_rate_sample(3.3, 100e6, 0.1, busy=False)
    assert wan.capacity_gbit(3.3) == pytest.approx(1.5)


def test_a_bad_recovery_half_life_is_rejected():
    with pytest.raises(ValueError, match="half-life"):
        model(recovery_half_life_s=0.0)


def test_outage_gives_a_finite_huge_prediction():
    wan = model()
    feed_rate(wan, 0.0, 1.0, 0.0)
    p = wan.predict(1.0, 0.25 * GB, 1.0)
    assert p.capacity_gbit == 0.0 and 1000 < p.wan_s < float("inf")


def test_rtt_change_is_seen():
    wan = model(rtt_window_s=2.0)
    for i in range(20):
        wan.add_rtt_sample(i * 0.1, 0.040 + (0.01 if i % 3 else 0))  # queueing noise
    assert wan.rtt_s(2.0) == pytest.approx(0.040)
    for i in range(21, 45):  # an rtt fault: 40 -> 200 ms
        wan.add_rtt_sample(i * 0.1, 0.200)
    assert wan.rtt_s(4.5) == pytest.approx(0.200)
    assert wan.predict(4.5, 0, 4.5).wan_s == pytest.approx(0.3)


def test_window_grows_with_the_rtt():
    wan = model(window_min_s=0.2, window_rtts=5)
    wan.add_rtt_sample(0.0, 0.2)
    assert wan.window_s() == pytest.approx(1.0)


@pytest.mark.parametrize("others, mine, expected", [
    ([], (0, 10), 10.0),
    ([(0, 10)], (0, 10), 20.0),
    ([(0, 100)], (0, 10), 20.0),          # each delays the other by min(b, S)
    ([(0, 5)], (0, 10), 15.0),
    ([(0, 10)], (4, 10), 4 + 6 * 2 + 4),  # joins after 4 s: shares for 12 s, then alone
    ([(20, 10)], (0, 10), 10.0),
])
def test_processor_sharing(others, mine, expected):
    assert ps_finish_s(others, mine, 1.0, 0.0) == pytest.approx(expected)


def test_bad_priors_are_rejected():
    with pytest.raises(ValueError):
        WanModel(line_gbit=0, prior_rtt_s=0.04)


def test_overhead_is_the_median_of_recent_residuals():
    wan = model(overhead_samples=3)
    base = wan.predict(0.0, 0.125 * GB, 0.0).wan_s  # 0.1 s + 60 ms
    wan.add_residual(1.4)  # one outlier (a fresh connection) does not move it
    wan.add_residual(0.04)
    wan.add_residual(0.02)
    assert wan.overhead_s == pytest.approx(0.04)
    assert wan.predict(0.0, 0.125 * GB, 0.0).wan_s == pytest.approx(base + 0.04)
    for _ in range(3):  # faster than the model: never a negative overhead
        wan.add_residual(-0.5)
    assert wan.overhead_s == 0.0


def test_latency_bound_transfers_are_shorter_than_an_rtt():
    wan = model()  # 10 Gbit/s, 40 ms: 50 MB per RTT
    assert wan.latency_bound(0.0, 10e6) and not wan.latency_bound(0.0, 100e6)


def test_a_standing_queue_delays_every_new_byte():
    wan = model(rtt_window_s=2.0)
    for i in range(10):
        wan.add_rtt_sample(i * 0.1, 0.040)
    idle = wan.predict(1.0, 0.0, 1.0).wan_s
    for i in range(10, 13):  # the bottleneck queue fills: probes wait 0.3 s in it
        wan.add_rtt_sample(i * 0.1, 0.340)
    p = wan.predict(1.3, 0.0, 1.3)
    assert p.queue_delay_s == pytest.approx(0.3) and p.wan_s == pytest.approx(idle + 0.3)


def test_watched_transfers_teach_the_overhead_once_both_ends_are_known():
    wan = model()
    pred = wan.predict(0.0, 10e6, 1.0)  # 8 ms + 60 ms, nothing ahead, latency-bound
    assert wan.watch(7, 0.0, 10e6, pred)
    wan.kv_done(7, 1.0 + pred.wan_s + 0.03)  # MD's KV_DONE may come before P's REPORT
    assert wan.n_residuals == 0
    wan.prefill_ended(7, 1.0)
    assert wan.n_residuals == 1 and wan.overhead_s == pytest.approx(0.03)
    # a big transfer, or one with another ahead of it, is not a latency sample
    assert not wan.watch(8, 0.0, 500e6, wan.predict(0.0, 500e6, 0.0))
    wan.commit(9, 500e6, 0.0)
    assert not wan.watch(10, 0.0, 10e6, wan.predict(0.0, 10e6, 0.0))
    # a forgotten request (failed, cancelled) teaches nothing and leaves the backlog
    assert wan.watch(11, 0.0, 10e6, pred)
    wan.forget(11)
    wan.forget(9)
    wan.prefill_ended(11, 1.0)
    wan.kv_done(11, 5.0)
    assert wan.n_residuals == 1 and wan.predict(0.0, 10e6, 0.0).backlog_transfers == 0


def finish(wan, rid, pred, start, took):
    wan.prefill_ended(rid, start)
    wan.kv_done(rid, start + took)


def test_margin_is_a_high_quantile_of_near_threshold_errors():
    wan = model(margin_band_s=1.0, margin_quantile=0.9)
    assert wan.margin_s() == 0.0  # no error seen yet
    pred = wan.predict(0.0, 10e6, 0.0)
    for rid, late in enumerate([0.0] * 8 + [0.5, 1.0], start=1):  # 2 of 10 were late
        wan.watch(rid, 0.0, 10e6, pred)
        finish(wan, rid, pred, 0.0, pred.wan_s + late)
    assert wan.n_errors == 10 and wan.margin_s() == pytest.approx(1.0)
    # the p50 margin ignores the late ones; errors below zero give no margin
    wan.margin_quantile = 0.5
    assert wan.margin_s() == pytest.approx(0.0)
    # a transfer predicted beyond the band (its route does not hinge on a near miss)
    # teaches nothing
    big = wan.predict(0.0, 2.5e9, 0.0)
    assert big.wan_s > 1.0
    wan.watch(99, 0.0, 2.5e9, big)
    finish(wan, 99, big, 0.0, big.wan_s + 5.0)
    assert wan.n_errors == 10


def test_margin_forgets_old_errors_and_can_be_off():
    wan = model(margin_samples=4, margin_quantile=1.0)
    pred = wan.predict(0.0, 10e6, 0.0)
    for rid, late in enumerate([2.0, 0.1, 0.1, 0.1, 0.1], start=1):
        wan.watch(rid, 0.0, 10e6, pred)
        finish(wan, rid, pred, 0.0, pred.wan_s + late)
    assert wan.margin_s() == pytest.approx(0.1)  # the 2 s one is out of the last 4
    off = model(margin_quantile=0.0)
    off.add_error(3.0)
    assert off.margin_s() == 0.0
    with pytest.raises(ValueError):
        model(margin_quantile=1.5)


def test_the_margin_of_a_short_transfer_scales_longer_transfers_errors_down():
    """The errors of transfers predicted longer than the request being routed count in
    proportion to its prediction; those of shorter or equal ones count whole. Quickstart's
    0.87 s transfer, 0.39 s late behind the cold ones (slow start on a fresh connection),
    gives a 0.07 s one 0.03 s of margin, not 0.39 s (unscaled, that margin alone nearly filled the 0.5 s threshold)."""
    wan = model(margin_band_s=1.0, margin_quantile=1.0)
    short = wan.predict(0.0, 10e6, 0.0)
    long_ = wan.predict(0.0, 1e9, 0.0)
    assert short.wan_s < long_.wan_s < 1.0
    wan.watch(1, 0.0, 1e9, long_)
    finish(wan, 1, long_, 0.0, long_.wan_s + 0.4)
    assert wan.margin_s() == pytest.approx(0.4)  # unscaled: the raw error
    assert wan.margin_s(wan_s=long_.wan_s) == pytest.approx(0.4)
    assert wan.margin_s(wan_s=2.0) == pytest.approx(0.4)  # longer than it: whole
    assert wan.margin_s(wan_s=short.wan_s) == pytest.approx(0.4 * short.wan_s / long_.wan_s)
    # a short transfer that waited 0.3 s (a queue, an outage) counts whole for every size
    wan.watch(2, 0.0, 10e6, short)
    finish(wan, 2, short, 1.0, short.wan_s + 0.3)
    assert wan.margin_s(wan_s=short.wan_s) == pytest.approx(0.3)
    assert wan.margin_s(wan_s=long_.wan_s) == pytest.approx(0.4)
    # an error recorded without its prediction counts whole
    bare = model(margin_quantile=1.0)
    bare.add_error(0.25)
    assert bare.margin_s(wan_s=0.01) == pytest.approx(0.25)


@pytest.mark.parametrize("others, mine, quantum, expected", [
    ([(0, 10), (0, 10)], (0, 1), 4, 9.0),     # one quantum of each ahead, then mine
    ([(0, 10), (0, 10)], (0, 1), 0, 3.0),     # quantum 0: the fluid limit
    ([], (0, 10), 4, 10.0),                   # alone: bytes / rate
    ([(0, 2)], (0, 10), 4, 12.0),             # a short one ahead delays it by its size
    ([(0, 10)], (5, 4), 4, 12.0),             # joins at 5, goes after the quantum in progress
    ([(20, 10)], (0, 10), 4, 10.0),           # starts after mine is done
])
def test_round_robin_with_a_quantum(others, mine, quantum, expected):
    assert rr_finish_s(others, mine, 1.0, 0.0, quantum) == pytest.approx(expected)


def test_a_short_transfer_waits_a_chunk_of_each_transfer_ahead():
    """A 16-token suffix behind five 1,000-token transfers (64-token chunks, 10 Gbit/s,
    token_scale 32 x 50 KB): five chunks ahead of it, not five times its own size."""
    tok = 32 * 50_000
    wan = model(quantum_bytes=64 * tok)
    for rid in range(5):
        wan.commit(rid, 1000 * tok, start_s=0.0)
    rate = 10e9 / 8
    got = wan.predict(0.0, 16 * tok, 0.0).wan_s - 1.5 * 0.04
    assert got == pytest.approx((5 * 64 + 16) * tok / rate)
    fluid = model().predict(0.0, 16 * tok, 0.0)
    assert fluid.wan_s < got / 3


def test_a_congested_spells_errors_stop_counting_after_the_window():
    """Errors of transfers whose KV reached MD more than margin_window_s ago do not set the
    margin: after a fault the router trusts its (accurate again) predictions, instead of
    relaying short transfers until 30 new samples have replaced the old ones."""
    wan = model(margin_quantile=0.9, margin_window_s=10.0)
    pred = wan.predict(0.0, 10e6, 0.0)
    for rid in range(1, 11):  # a congested spell: every transfer 1.5 s late, done by t=21
        wan.watch(rid, 0.0, 10e6, pred)
        finish(wan, rid, pred, 2.0 * rid, pred.wan_s + 1.5)
    assert wan.margin_s(now_s=22.0) == pytest.approx(1.5)
    for rid in range(11, 14):  # after it: three accurate transfers
        wan.watch(rid, 0.0, 10e6, pred)
        finish(wan, rid, pred, 20.0 + rid, pred.wan_s)
    # 10 late and 3 accurate in the deque: the old rule (every kept error) still says 1.5
    assert wan.margin_s() == pytest.approx(1.5)
    # at t=40 only the accurate three (KV done at t >= 30) are in the window
    assert wan.margin_s(now_s=40.0) == pytest.approx(0.0, abs=1e-9)
    assert wan.margin_s(now_s=60.0) == 0.0  # nothing recent: no margin
