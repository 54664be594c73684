"""The RLD -> MD token-ID handoff state machines, without I/O (testbed.pdd.roles.handoff)."""

from __future__ import annotations

import random

import pytest

from testbed.errors import ProtocolError
from testbed.types import HandoffMode
from testbed.pdd.roles.handoff import HandoffBatch, MainHandoff, RelayHandoff, RelayPhase

ONE, CATCH = HandoffMode.ONE_SHOT, HandoffMode.CATCH_UP


def test_one_shot_hands_over_every_emitted_token_in_one_final_batch():
    h = RelayHandoff(ONE, threshold=4)
    h.on_emitted(100)
    assert h.on_kv_ready() == HandoffBatch(0, 0, 100, True)
    assert h.phase == RelayPhase.HANDED_OVER and not h.decoding
    assert h.on_kv_ready() is None and h.on_ack(0, 100) is None
    with pytest.raises(ValueError):
        h.on_emitted(101)  # RLD stops decoding at once


def test_catch_up_sends_batches_until_the_rest_is_within_the_threshold():
    h = RelayHandoff(CATCH, threshold=4, max_batches=8)
    h.on_emitted(20)
    assert h.on_kv_ready() == HandoffBatch(0, 0, 20, False)
    assert h.phase == RelayPhase.CATCHING_UP and h.decoding
    h.on_emitted(27)  # RLD kept decoding while MD extended [0, 20)
    assert h.on_ack(0, 20) == HandoffBatch(1, 20, 27, False)  # 7 > 4
    h.on_emitted(30)
    assert h.on_ack(1, 27) == HandoffBatch(2, 27, 30, True)  # 3 <= 4: final
    assert h.phase == RelayPhase.HANDED_OVER and h.sent_end == 30
    assert [b.n_tokens for b in h.batches] == [20, 7, 3]


def test_catch_up_with_few_tokens_is_a_single_final_batch():
    h = RelayHandoff(CATCH, threshold=64)
    h.on_emitted(64)
    assert h.on_kv_ready() == HandoffBatch(0, 0, 64, True)


def test_catch_up_final_batch_may_be_empty_when_rld_emitted_nothing_meanwhile():
    h = RelayHandoff(CATCH, threshold=4)
    h.on_emitted(10)
    h.on_kv_ready()
    assert h.on_ack(0, 10) == HandoffBatch(1, 10, 10, True)


def test_catch_up_is_bounded_by_max_batches_when_the_wan_is_slower_than_decoding():
    h = RelayHandoff(CATCH, threshold=2, max_batches=3)
    h.on_emitted(10)
    h.on_kv_ready()
    h.on_emitted(20)
    assert not h.on_ack(0, 10).final
    h.on_emitted(30)
    assert h.on_ack(1, 20) == HandoffBatch(2, 20, 30, True)  # batch #3: final anyway


@pytest.mark.parametrize("mode", [ONE, CATCH])
def test_request_finishing_on_rld_before_kv_ready_cancels_md(mode):
    h = RelayHandoff(mode, threshold=4)
    h.on_emitted(32)
    assert h.on_finished() is True  # MD must drop the request
    assert h.phase == RelayPhase.FINISHED_LOCAL
    assert h.on_kv_ready() is None and h.batches == []


def test_request_finishing_on_rld_during_catch_up_ignores_the_late_ack():
    h = RelayHandoff(CATCH, threshold=4)
    h.on_emitted(20)
    h.on_kv_ready()
    h.on_emitted(32)
    assert h.on_finished() is True
    assert h.on_ack(0, 20) is None


@pytest.mark.parametrize("mode", [ONE, CATCH])
def test_kv_ready_before_rld_emitted_anything_hands_over_an_empty_final_batch(mode):
    h = RelayHandoff(mode, threshold=4)
    assert h.on_kv_ready() == HandoffBatch(0, 0, 0, True)
    assert not h.decoding  # RLD never emits for this request


def test_md_lost_during_catch_up_makes_rld_finish_the_request():
    h = RelayHandoff(CATCH, threshold=4)
    h.on_emitted(20)
    h.on_kv_ready()
    assert h.on_md_lost() is True
    assert h.decoding and h.pipeline_suffix == "->rld"
    assert h.on_ack(0, 20) is None and h.on_kv_ready() is None
    h.on_emitted(40)
    assert h.on_finished() is False  # nothing to cancel: MD is gone


def test_md_lost_after_rld_finished_changes_nothing():
    h = RelayHandoff(ONE)
    h.on_emitted(5)
    h.on_finished()
    assert h.on_md_lost() is False and h.pipeline_suffix == ""


def test_an_ack_that_does_not_match_the_batch_in_flight_is_a_protocol_error():
    h = RelayHandoff(CATCH, threshold=4)
    h.on_emitted(20)
    h.on_kv_ready()
    with pytest.raises(ProtocolError, match="does not match"):
        h.on_ack(0, 19)


def test_main_handoff_extends_only_new_ids_and_predicts_the_next_token():
    md = MainHandoff(first_token=7)
    new = md.plan(0, (7, 8, 9), final=False)
    assert new == (7, 8, 9) and md.mismatches == 0
    md.applied(new, predicted=10, final=False)
    assert (md.next_position, md.next_token) == (3, 10)
    new = md.plan(3, (10, 11), final=True)
    md.applied(new, predicted=12, final=True)
    assert (md.next_position, md.next_token, md.final) == (5, 12, True)
    with pytest.raises(ProtocolError, match="after the final"):
        md.plan(5, (), True)


def test_main_handoff_empty_final_batch_makes_md_emit_p_token_at_position_0():
    md = MainHandoff(first_token=42)
    assert md.plan(0, (), final=True) == ()
    md.applied((), None, final=True)
    assert (md.next_position, md.next_token) == (0, 42)


def test_main_handoff_skips_a_resent_prefix_and_rejects_gaps_and_contradictions():
    md = MainHandoff(first_token=1)
    md.applied(md.plan(0, (1, 2, 3), False), predicted=4, final=False)
    assert md.plan(0, (1, 2, 3, 4, 5), True) == (4, 5)  # the router re-sends all of RLD's ids
    with pytest.raises(ProtocolError, match="other ids"):
        md.plan(0, (1, 9, 3, 4), True)
    with pytest.raises(ProtocolError, match="MD is at 3"):
        md.plan(4, (5,), True)


def test_main_handoff_counts_a_token_that_differs_from_its_prediction():
    md = MainHandoff(first_token=1)
    md.applied(md.plan(0, (1, 2), False), predicted=3, final=False)
    md.plan(2, (99,), True)
    assert md.mismatches == 1


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("mode", [ONE, CATCH])
def test_random_interleavings_emit_every_position_exactly_once(mode, seed):
    """RLD emits ref[0..m), MD emits ref[m..end) for any timing of KV_READY and acks."""
    rng = random.Random(seed)
    ref = [rng.randrange(100) for _ in range(rng.randrange(1, 120))]
    rld, md = RelayHandoff(mode, rng.choice([0, 3, 16]), rng.randrange(1, 6)), MainHandoff(ref[0])
    emitted, in_flight, kv_ready_at = [], [], rng.randrange(0, 150)
    for tick in range(1000):
        if rld.decoding and len(emitted) < len(ref) and rng.random() < 0.6:
            emitted.append(ref[len(emitted)])
            rld.on_emitted(len(emitted))
            if len(emitted) == len(ref):
                rld.on_finished()
        if tick == kv_ready_at and (b := rld.on_kv_ready()):
            in_flight.append(b)
        if in_flight and rng.random() < 0.3:  # MD applies the batch, RLD gets the ack
            b = in_flight.pop(0)
            new = md.plan(b.start, tuple(emitted[b.start:b.end]), b.final)
            md.applied(new, ref[b.end] if new and b.end < len(ref) else None, b.final)
            if not b.final and (nxt := rld.on_ack(b.batch, md.next_position)):
                in_flight.append(nxt)
        if not rld.decoding and not in_flight:
            break
    md_from = md.next_position if md.final else len(ref)
    assert emitted == ref[: len(emitted)]
    assert md_from == (len(ref) if rld.phase == RelayPhase.FINISHED_LOCAL else len(emitted))
    assert md.mismatches == 0
