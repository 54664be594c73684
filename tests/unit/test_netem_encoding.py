"""netem TCA_OPTIONS encoding vs. what iproute2's tc sends, byte for byte.

Fixtures (tests/unit/fixtures/netem/*.hex) hold whole RTM_NEWQDISC messages
that iproute2 6.1 `tc` sent, captured with strace in a throwaway netns on a
kernel without sch_netem (the kernel refused them, the bytes are still what tc
asks for); each file's first line is the command. We build the same request
through pyroute2's own IPRoute.tc() request path with our plugin registered
and compare everything except seq/pid and ifindex. No root needed.
"""

from __future__ import annotations

import glob
import hashlib
import struct
import types
from pathlib import Path

import pytest
from pyroute2.iproute.linux import get_arguments_processor, get_dump_filter
from pyroute2.netlink.nlsocket import NetlinkRequest
from pyroute2.netlink.rtnl import RTM_NEWQDISC, TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import plugins, tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import percent2u32

from testbed.errors import PlanError
from testbed.net import netem
from testbed.net.netem import NetemParams, distribution_table, netem_request, pct_to_u32

FIXTURES = Path(__file__).parent / "fixtures" / "netem"
GE = "gilbert_elliott"

# fixture -> (tc qdisc command after "dev lo", the equivalent NetemParams)
CASES = {
    "ge_normal": ("root", NetemParams(
        delay_us=10_000, jitter_us=2_000, distribution="normal", loss_model=GE,
        ge_p_pct=1, ge_r_pct=20, ge_bad_loss_pct=70, ge_good_loss_pct=0.1, limit_pkts=1000)),
    "delay_only": ("root", NetemParams(delay_us=50_000)),
    "pareto_random_loss": ("root", NetemParams(
        delay_us=25_000, jitter_us=5_000, distribution="pareto", loss_pct=0.5, limit_pkts=8334)),
    "paretonormal_reorder": ("root", NetemParams(
        delay_us=40_000, jitter_us=4_000, distribution="paretonormal", reorder_pct=2,
        limit_pkts=20_000)),
    "uniform_jitter_loss": ("root", NetemParams(delay_us=30_000, jitter_us=3_000, loss_pct=1)),
    "loss_only": ("root", NetemParams(loss_pct=0.01, limit_pkts=100)),
    # tc's "gemodel P" alone means r = 100 - P (NetemParams' default r is 100)
    "ge_p_only": ("root", NetemParams(
        delay_us=100_000, jitter_us=10_000, distribution="normal", loss_model=GE,
        ge_p_pct=0.5, ge_r_pct=99.5)),
    "delay_duplicate": ("root", NetemParams(delay_us=10_000, duplicate_pct=1)),
    "long_delay_200s": ("root", NetemParams(delay_us=200_000_000, limit_pkts=100_000)),
    "replace_child_ge": ("child", NetemParams(
        delay_us=5_000, jitter_us=1_000, loss_model=GE, ge_p_pct=2, ge_r_pct=30,
        ge_bad_loss_pct=50, ge_good_loss_pct=0, limit_pkts=500)),
}
# tc's placement for each kind of case: (pyroute2 command, parent, handle)
PLACEMENT = {"root": ("add", TC_H_ROOT, 0), "child": ("replace", 0x00010010, 0x00100000)}
COMMAND_MAP = {"add": (RTM_NEWQDISC, "create"), "replace": (RTM_NEWQDISC, "replace")}

# sha256 of the 4096 s16 (little-endian) of each table; equal to the digests of
# iproute2 6.1's normal/pareto/paretonormal.dist, so this checks without them
TABLE_SHA256 = {
    "normal": "ea496767068d0be9eb46cb69ee90470105525b9090a6d479dadf04db0f3d44a5",
    "pareto": "bb133e76721f7df4fd75dd647aad368fa8e9eaf9b9797fc8d208dde5f9ffbd2a",
    "paretonormal": "ca372e5f4871aa11f38e71c82bd18e074e068f0704291e8a859ebd1aaee2f9f1",
}


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(plugins, "netem", plugins["netem"])  # restored after the test
    netem.register()


def load_fixture(name: str) -> tuple[str, bytes]:
    lines = (FIXTURES / f"{name}.hex").read_text().splitlines()
    command = lines[0].removeprefix("# command: ")
    return command, bytes.fromhex("".join(x for x in lines if not x.startswith("#")))


def tc_request_bytes(command: str, **kwarg) -> bytes:
    """The message IPRoute.tc(command, **kwarg) sends (pyroute2 0.9 request path), no socket."""
    sock = types.SimpleNamespace(addr_pool=types.SimpleNamespace(alloc=lambda: 1),
                                 status={"nlm_echo": False}, epid=0, marshal=None)
    dump_filter, kwarg = get_dump_filter("tc", command, kwarg)
    arguments = get_arguments_processor("tc", command, kwarg)
    request = NetlinkRequest(sock, tcmsg(), command, COMMAND_MAP, dump_filter, arguments)
    request.msg.encode()
    return bytes(request.msg.data)


def masked(msg: bytes) -> bytes:
    """Blank nlmsg seq + pid (8..16) and tcm_ifindex (20..24)."""
    out = bytearray(msg)
    out[8:16] = bytes(8)
    out[20:24] = bytes(4)
    return bytes(out)


def options_bytes(params: NetemParams) -> bytes:
    """TCA_OPTIONS payload (qopt + attributes) from our nla class alone."""
    opts = netem.options()
    opts.setvalue(netem.encode_options(params))
    opts.encode()
    return bytes(opts.data[4:opts.length])


def test_every_fixture_has_a_case():
    assert sorted(p.stem for p in FIXTURES.glob("*.hex")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_request_matches_tc_byte_for_byte(registered, name):
    command_line, tc_bytes = load_fixture(name)
    placement, params = CASES[name]
    command, parent, handle = PLACEMENT[placement]
    assert command_line.startswith(f"tc qdisc {command} dev lo ")
    ours = tc_request_bytes(command, kind="netem", index=1, parent=parent, handle=handle,
                            **netem_request(params))
    assert len(ours) == len(tc_bytes)
    assert masked(ours) == masked(tc_bytes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_options_class_alone_matches_tc(name):
    _, tc_bytes = load_fixture(name)
    options_at = 36 + 12  # nlmsghdr 16 + tcmsg 20, then TCA_KIND "netem\0" padded to 12
    length, kind = struct.unpack_from("HH", tc_bytes, options_at)
    assert kind == 2  # TCA_OPTIONS
    expected = tc_bytes[options_at + 4:options_at + length]
    assert options_bytes(CASES[name][1]) == expected


def test_request_decodes_back(registered):
    _, params = CASES["ge_normal"]
    raw = tc_request_bytes("add", kind="netem", index=1, parent=TC_H_ROOT, handle=0,
                           **netem_request(params))
    msg = tcmsg(raw)
    msg.decode()
    opts = msg.get_attr("TCA_OPTIONS")
    assert (opts["latency"], opts["jitter"], opts["limit"]) == (156_250, 31_250, 1000)
    ge = opts.get_attr("TCA_NETEM_LOSS").get_attr("NETEM_LOSS_GE")
    assert (ge["p"], ge["r"], ge["h"], ge["k1"]) == (
        0x028F5C29, 0x33333333, 0x4CCCCCCD, 0x00418937)
    assert opts.get_attr("TCA_NETEM_DELAY_DIST") == distribution_table("normal")


# --- encodings tc 6.1 cannot produce (no seed keyword, no 64-bit latency) -------

def test_seed_is_u64_attribute_before_table():
    params = NetemParams(delay_us=1_000, jitter_us=128, distribution="normal", seed=2**40 + 7)
    data = options_bytes(params)
    attrs = data[24:]
    assert attrs[:12] == struct.pack("<HHQ", 12, 14, 2**40 + 7)  # TCA_NETEM_PRNG_SEED
    assert struct.unpack_from("<HH", attrs, 12) == (4 + 8192, 2)  # then TCA_NETEM_DELAY_DIST


@pytest.mark.parametrize("delay_us, ticks, latency64", [
    (1_000, 15_625, None),  # whole ticks: legacy field only, as tc 6.1
    (200_000_000, 3_125_000_000, None),  # 200 s still fits the u32 tick field
    (1_001, 15_640, 1_001_000),  # 15640.625 ticks: exact ns in LATENCY64
    (300_000_000, 0xFFFFFFFF, 300_000_000_000),  # beyond ~274.9 s: saturate + LATENCY64
])
def test_latency64_only_when_ticks_are_not_exact(delay_us, ticks, latency64):
    data = options_bytes(NetemParams(delay_us=delay_us))
    assert struct.unpack_from("<I", data, 0)[0] == ticks
    extra = data[24:]
    if latency64 is None:
        assert extra == b""
    else:
        assert extra == struct.pack("<HHq", 12, 10, latency64)  # TCA_NETEM_LATENCY64


def test_jitter64_carries_sub_tick_jitter():
    data = options_bytes(NetemParams(delay_us=8_000, jitter_us=3))
    assert struct.unpack_from("<6I", data, 0) == (125_000, 1000, 0, 0, 0, 46)
    assert data[24:] == struct.pack("<HHq", 12, 11, 3_000)  # TCA_NETEM_JITTER64


def test_psched_tick_is_64ns_on_this_kernel():
    try:
        fields = Path("/proc/net/psched").read_text().split()
    except OSError:
        pytest.skip("no /proc/net/psched")
    assert int(fields[1], 16) == netem.PSCHED_TICK_NS


# --- percentages and Gilbert-Elliott ------------------------------------------

@pytest.mark.parametrize("pct, u32", [
    (0, 0), (100, 0xFFFFFFFF), (1, 0x028F5C29), (0.1, 0x00418937), (20, 0x33333333),
    (70, 0xB3333332),  # 3006477106.5 rounds to even, like rint
])
def test_pct_to_u32_rounds_like_tc(pct, u32):
    assert pct_to_u32(pct) == u32


def test_pyroute2_percent2u32_truncates_and_would_differ():
    assert percent2u32(1) == pct_to_u32(1) - 1


def test_ge_h_is_complement_of_bad_loss():
    ge = netem.encode_options(NetemParams(loss_model=GE, ge_p_pct=1, ge_bad_loss_pct=70))
    model = ge["attrs"][0][1]["attrs"][0][1]
    assert model["h"] == 0xFFFFFFFF - pct_to_u32(70) != pct_to_u32(30)


# --- distribution tables --------------------------------------------------------

def system_dist_file(name: str) -> Path | None:
    for pattern in ("/usr/lib/tc/", "/usr/lib/*/tc/", "/usr/lib64/tc/", "/usr/share/tc/"):
        found = sorted(glob.glob(f"{pattern}{name}.dist"))
        if found:
            return Path(found[0])
    return None


def read_dist(path: Path) -> tuple[int, ...]:
    """Parse a .dist file the way tc's get_distribution() does."""
    values = []
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            values += [int(v, 0) for v in line.split()]
    return tuple(values)


@pytest.mark.parametrize("name", ["normal", "pareto", "paretonormal"])
def test_generated_table_equals_system_file(name):
    path = system_dist_file(name)
    if path is None:
        pytest.skip(f"iproute2's {name}.dist not installed")
    assert distribution_table(name) == read_dist(path)


@pytest.mark.parametrize("name", ["normal", "pareto", "paretonormal"])
def test_generated_table_shape_and_digest(name):
    table = distribution_table(name)
    assert len(table) == 4096 and all(-32768 <= v <= 32767 for v in table)
    assert list(table) == sorted(table)  # an inverse CDF
    digest = hashlib.sha256(struct.pack("<4096h", *table)).hexdigest()
    assert digest == TABLE_SHA256[name]


def test_uniform_sends_no_table_and_unknown_name_raises():
    assert netem.encode_options(NetemParams(delay_us=16, jitter_us=8))["attrs"] == []
    with pytest.raises(PlanError):
        distribution_table("uniform")


# --- one rule set ---------------------------------------------------------------

def test_the_encoder_takes_the_spec_validated_stage_and_applies_tcs_table_rule():
    """NetemParams is a plain encoding: the rules are LinkSpec's (testbed/impairment.py),
    checked once when the stage is built; the encoder adds only tc's rule that a
    distribution table goes with a delay and a jitter."""
    from testbed.errors import SpecError
    from testbed.net.encoders import netem_params
    from testbed.net.plan import Impairment
    from testbed.impairment import NO_LOSS, LinkSpec

    with pytest.raises(SpecError, match="reorder_pct"):
        LinkSpec(10.0, reorder_pct=5)  # reordering needs a delay: the spec says so, once
    with pytest.raises(SpecError, match="jitter_distribution"):
        Impairment(5.0, 1.0, "gauss", NO_LOSS, 0.0, 100, 1)
    jitter_only = netem_params(Impairment.of(LinkSpec(10.0, jitter_ms=1.0,
                                                      jitter_distribution="pareto"), 100, 1))
    assert (jitter_only.delay_us, jitter_only.distribution) == (0, "uniform")
    both = netem_params(Impairment.of(LinkSpec(10.0, delay_ms=5.0, jitter_ms=1.0,
                                               jitter_distribution="pareto",
                                               duplicate_pct=2.0), 100, 1))
    assert (both.distribution, both.duplicate_pct) == ("pareto", 2.0)


def test_unknown_tc_keyword_rejected(registered):
    with pytest.raises(PlanError, match="unknown tc"):
        tc_request_bytes("add", kind="netem", index=1, delay="10ms")


def test_register_swaps_the_one_dict_both_pyroute2_paths_use(registered):
    from pyroute2.requests.tc import tc_plugins

    netem.register()
    assert tc_plugins is plugins and plugins["netem"] is netem.PLUGIN
