"""testbed/bench/tcp_loss.py: its loss syntax, and its virtual-clock figures (the model's
answer to the emulator's measurement), no root."""

from __future__ import annotations

import pytest

from pathlib import Path

from testbed.bench.tcp_loss import loss_label, main, parse_loss, virtual_rows
from testbed.errors import SpecError
from testbed.spec.topology import load_topology

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text", ["none", "random:2.5", "ge:5,30,50", "ge:5,30,50,1"])
def test_a_loss_reads_back_as_written(text):
    want = text if text.count(",") != 2 else text + ",0"
    assert loss_label(parse_loss(text)) == want


@pytest.mark.parametrize("text", ["random", "random:x", "ge:5,30", "burst:3", "random:150"])
def test_a_bad_loss_is_refused_naming_it(text, capsys):
    with pytest.raises(SpecError):
        parse_loss(text)
    assert main(["--clock", "virtual", "--loss", text]) == 2
    err = capsys.readouterr().err
    assert (text in err) if text != "random:150" else "loss.pct" in err and "150" in err


def test_the_model_costs_loss_what_its_retransmissions_and_recovery_take():
    topo = load_topology(ROOT / "topologies" / "two-dc.yaml")
    rows = virtual_rows(topo, 25.0, [parse_loss("none"), parse_loss("random:3")], 10.0,
                        [65536, 4 << 20], 15)
    clean, lossy = rows
    mbit = topo.wan.a_to_b.rate_gbit / 25 * 1e3 * 1448 / 1514  # the line's payload rate
    assert clean["bulk_mbit"] == pytest.approx(mbit, rel=0.01)
    # a frame in 33 is served twice: 10 s of bulk goodput fall by about that share (and by
    # the last lost frame's recovery, a round trip or two of the 10 s)
    assert mbit * 0.955 < lossy["bulk_mbit"] < mbit * 0.972
    c, l4 = clean["transfers"][str(4 << 20)], lossy["transfers"][str(4 << 20)]
    assert l4["p90_s"] > c["p90_s"] and l4["median_s"] >= c["median_s"]
    # a lossless transfer is the line's: RTT + size / rate
    assert c["median_s"] == pytest.approx(0.040 + (4 << 20) * 8 / (mbit * 1e6), rel=0.03)
