"""The status REPORTs of request id 0: one declaration for writer (MD, P) and reader
(the router), every field checked when read."""

from __future__ import annotations

import json

import pytest

from testbed.pdd.wire.protocol import Report, Role
from testbed.pdd.wire.status import TcpStatus, WanStatus


def _over_the_wire(data: dict) -> dict:
    report = Report(Role.MAIN_DECODE, "md1", data)
    return Report.decode(report.encode()).data


def test_wan_status_round_trips_through_a_report():
    st = WanStatus(0.1, 4096, True, {7: 100.0, 9: 0.0}, {8: 1234.5})
    back = WanStatus.read(_over_the_wire(st.data()))
    assert back == st
    assert json.loads(json.dumps(st.data()))["pending"] == {"7": 100.0, "9": 0.0}


def test_tcp_status_round_trips_through_a_report():
    st = TcpStatus(0.2, 1000, 12, 0.25)
    assert TcpStatus.read(_over_the_wire(st.data())) == st


@pytest.mark.parametrize("change, field", [
    ({"kind": "tcp"}, "kind"),
    ({"interval_s": -1}, "interval_s"),
    ({"rx_bytes": 1.5}, "rx_bytes"),
    ({"rx_bytes": float("nan")}, "rx_bytes"),
    ({"busy": "yes"}, "busy"),
    ({"pending": [1, 2]}, "pending"),
    ({"pending": {"x": 1}}, "pending"),
    ({"kv_done": {"3": "soon"}}, "3"),
])
def test_a_bad_wan_status_names_its_field(change, field):
    data = {**WanStatus(0.1, 10, False).data(), **change}
    with pytest.raises(ValueError, match=f"^{field}:|{field}"):
        WanStatus.read(data)


def test_a_bad_tcp_status_names_its_field():
    with pytest.raises(ValueError, match="^retrans:"):
        TcpStatus.read({**TcpStatus(0.1, 5, 1, 0.2).data(), "retrans": -1})
    with pytest.raises(ValueError, match="^segs_out:"):
        TcpStatus.read({"kind": "tcp", "interval_s": 0.1, "retrans": 0, "rto_s": 0.2})
