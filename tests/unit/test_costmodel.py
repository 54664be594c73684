"""Cost model: monotonicity, orders of magnitude against the paper (docs/paper.md)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.pdd.compute.costmodel import (
    BIG_MODEL, GPU_A, GPU_B, ChipProfile, CostModel, ModelProfile,
)

P = CostModel(GPU_A)   # prefill / RLD instance
MD = CostModel(GPU_B)  # main decode instance
K64 = 65536
ctx = st.integers(0, 200_000)
n_tok = st.integers(1, 20_000)


def test_profiles_are_frozen_and_chips_differ_as_the_paper_says():
    with pytest.raises(AttributeError):
        GPU_A.peak_tflops = 1.0  # type: ignore[misc]
    assert GPU_A.peak_tflops > GPU_B.peak_tflops
    assert GPU_B.mem_bw_tbs > GPU_A.mem_bw_tbs
    assert BIG_MODEL.kv_bytes_per_token == 50_000


@pytest.mark.parametrize("what, seconds, lo, hi", [
    # The paper (docs/paper.md): 64K-context prefill of the missing suffix takes seconds.
    ("full 64K prefill on GPU_A", P.prefill_s(K64), 2.0, 30.0),
    ("10%-miss suffix prefill on GPU_A", P.prefill_s(K64 // 10, K64 - K64 // 10), 0.3, 5.0),
    # Decode step of 64K contexts at modest batch: tens of ms.
    ("decode step 16 x 64K on GPU_B", MD.decode_step_s(16, 16 * K64), 0.010, 0.100),
    ("decode step 32 x 64K on GPU_B", MD.decode_step_s(32, 32 * K64), 0.010, 0.100),
    # 100-token handoff recompute: 305 ms in the paper including the WAN.
    ("extend 100 on 64K on GPU_B", MD.extend_s(100, K64), 0.010, 0.305),
])
def test_orders_of_magnitude(what, seconds, lo, hi):
    assert lo <= seconds <= hi, f"{what}: {seconds:.3f} s not in [{lo}, {hi}]"


def test_each_chip_is_better_at_its_own_phase():
    assert P.prefill_s(K64) < MD.prefill_s(K64)
    assert MD.decode_step_s(16, 16 * K64) < P.decode_step_s(16, 16 * K64)


def test_decode_step_is_memory_bound_weights_plus_kv():
    m, c = BIG_MODEL, GPU_B
    bw = MD.n_chips * c.mem_bw_tbs * 1e12 * c.mem_eff
    nbytes = m.weight_bytes + m.kv_bytes_per_token * (16 * K64 + 16)
    expect = c.pass_overhead_ms / 1e3 + nbytes / bw
    assert MD.decode_step_s(16, 16 * K64) == pytest.approx(expect)


def test_extend_is_one_pass_much_cheaper_than_stepwise_decode():
    one = MD.extend_s(100, K64)
    assert one < 100 * MD.decode_step_s(1, K64) / 10
    assert one > MD.decode_step_s(1, K64)  # but more than a single step
    assert MD.extend_s(1, K64) == pytest.approx(MD.decode_step_s(1, K64))


@settings(max_examples=200, deadline=None)
@given(n=n_tok, c=ctx, dn=st.integers(1, 5000), dc=st.integers(1, 50_000))
def test_prefill_and_extend_monotone(n, c, dn, dc):
    for cm in (P, MD):
        assert cm.prefill_s(n + dn, c) >= cm.prefill_s(n, c)
        assert cm.prefill_s(n, c + dc) >= cm.prefill_s(n, c)
        assert cm.extend_s(n + dn, c) >= cm.extend_s(n, c)


@settings(max_examples=200, deadline=None)
@given(b=st.integers(1, 512), c=ctx, db=st.integers(1, 64), dc=st.integers(1, 100_000))
def test_decode_step_monotone_in_batch_and_context(b, c, db, dc):
    for cm in (P, MD):
        assert cm.decode_step_s(b + db, c) >= cm.decode_step_s(b, c)
        assert cm.decode_step_s(b, c + dc) >= cm.decode_step_s(b, c)


def test_more_chips_are_faster_and_bad_inputs_rejected():
    assert CostModel(GPU_A, n_chips=8).prefill_s(K64) < P.prefill_s(K64)
    assert P.prefill_s(0, 100) == 0.0 and MD.decode_step_s(0, 0) == 0.0
    with pytest.raises(ValueError):
        CostModel(GPU_A, n_chips=0)
    with pytest.raises(ValueError):
        P.prefill_s(-1)
    with pytest.raises(ValueError):
        MD.decode_step_s(1, -5)


def test_custom_profiles():
    slow = ChipProfile("slow", peak_tflops=100.0, mem_bw_tbs=1.0)
    small = ModelProfile(n_params=7e9, n_layers=32, d_attn=4096, kv_bytes_per_token=10_000)
    assert CostModel(slow, small).decode_step_s(1, 1000) < CostModel(slow).decode_step_s(1, 1000)
