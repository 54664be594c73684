"""Cluster config loading and strict validation (testbed.pdd.run.config), and KV payloads."""

from __future__ import annotations

import copy
import json

import pytest

from testbed.errors import ProtocolError, SpecError
from testbed.pdd.run.config import ClusterConfig, config_to_dict, load_config, parse_config
from testbed.types import HandoffMode, Mode
from testbed.pdd.wire.kvpayload import chunk_frame_bytes, decode_kv, encode_kv, kv_chunk
from testbed.pdd.compute.model import ModelConfig, build_model
from testbed.pdd.wire.protocol import HEADER_SIZE, Frame, FrameDecoder, encode_frame
from testbed.pdd.wire.fields import Role

GOOD = {
    "mode": "pdd",
    "model": {"d_model": 64, "n_layer": 2, "n_head": 2},
    "timing": {"time_scale": 0.5, "kv_scale_k": 10, "token_scale": 1},
    "relay": {"handoff_mode": "one-shot", "catchup_threshold_tokens": 32},
    "instances": [
        {"name": "p0", "role": "prefill", "host": "127.0.0.1", "port": 7101, "dc": "A"},
        {"name": "rld0", "role": "relay_decode", "host": "127.0.0.1", "port": 7102},
        {"name": "md0", "role": "main_decode", "host": "127.0.0.1", "port": 7103, "dc": "B"},
        {"name": "router", "role": "router", "host": "127.0.0.1", "port": 7100},
        {"name": "c0", "role": "client"},
    ],
}


def test_a_valid_config_loads_with_defaults_and_round_trips(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(GOOD))
    cfg = load_config(path)
    assert cfg.mode == Mode.PDD and cfg.relay.handoff_mode == HandoffMode.ONE_SHOT
    assert cfg.instance("md0").role == Role.MAIN_DECODE and cfg.instance("md0").dc == "B"
    assert cfg.model == ModelConfig(d_model=64, n_layer=2, n_head=2)
    assert cfg.router.relay_threshold_s == 0.5  # default
    assert parse_config(json.loads(json.dumps(config_to_dict(cfg)))) == cfg


def test_time_scale_and_k_reach_the_cost_model_and_payload_sizes():
    cfg = parse_config(GOOD)
    assert cfg.timing.modeled_kv_bytes(64) == 64 * 50_000 // 10
    assert cfg.timing.cost(Role.MAIN_DECODE).chip.name == "GPU-B"
    assert cfg.timing.cost(Role.RELAY_DECODE).chip.name == "GPU-A"


def _with(path: str, value):
    obj = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = obj
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DELETE:
        del node[int(last) if isinstance(node, list) else last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return obj


_DELETE = object()

BAD = [
    ("unknown top key", _with("extra", 1), "extra", "one of ["),
    ("unknown nested key", _with("timing.speed", 2), "timing.speed", "'time_scale'"),
    ("bad mode", _with("mode", "pd"), "mode", "pdd | cross-dc-pd"),
    ("bad handoff mode", _with("relay.handoff_mode", "eager"), "relay.handoff_mode", "one-shot"),
    ("string for int", _with("relay.catchup_threshold_tokens", "64"), "relay.catchup_threshold_tokens",
     "an integer"),
    ("bool for int", _with("relay.catchup_threshold_tokens", True), "relay.catchup_threshold_tokens",
     "an integer"),
    ("negative time scale", _with("timing.time_scale", 0), "timing.time_scale", "a value in"),
    ("k below 1", _with("timing.kv_scale_k", 0.5), "timing.kv_scale_k", "a value in"),
    ("bad role", _with("instances.0.role", "gpu"), "instances[0].role", "prefill | relay_decode"),
    ("bad dc", _with("instances.0.dc", "C"), "instances[0].dc", "A | B"),
    ("port out of range", _with("instances.0.port", 70000), "instances[0].port", "a value in"),
    ("missing name", _with("instances.1.name", _DELETE), "instances[1].name", "required"),
    ("duplicate name", _with("instances.1.name", "p0"), "instances[1].name", "a unique name"),
    ("server without port", _with("instances.0.port", 0), "instances[0].port", "a port"),
    ("no md for pdd", _with("instances.2", {"name": "x", "role": "client"}), "instances",
     "main_decode"),
    ("model not object", _with("model", 3), "model", "an object"),
    ("bad model value", _with("model.n_head", 3), "model", "a valid ModelConfig"),
    ("bad engine", _with("model.engine", "jax"), "model.engine", "torch | hash"),
]


@pytest.mark.parametrize("obj, path, expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_invalid_configs_name_the_path_and_what_was_expected(obj, path, expected):
    with pytest.raises(SpecError) as info:
        parse_config(obj, "c.json")
    assert info.value.path == path and expected in info.value.expected


def test_cross_dc_pd_needs_no_relay_decode():
    obj = _with("mode", "cross-dc-pd")
    obj["instances"] = [i for i in obj["instances"] if i["role"] != "relay_decode"]
    assert parse_config(obj).mode == Mode.CROSS_DC_PD


def test_defaults_match_the_design():
    cfg = ClusterConfig()
    assert cfg.relay.catchup_threshold_tokens == 64 and cfg.relay.handoff_mode == HandoffMode.CATCH_UP
    assert cfg.router.anomalous_filter and cfg.router.anomalous_max_output_tokens == 500
    assert cfg.prefill.block_size == 16


def test_kv_chunk_is_padded_to_the_modeled_size_and_decodes_to_the_same_kv():
    model = build_model(ModelConfig(d_model=32, n_layer=2, n_head=2))
    _, cache = model.prefill(list(range(40)))
    chunk, overrun = kv_chunk(cache, 16, 40, modeled_bytes=100_000)
    assert len(chunk.data) + chunk.filler == 100_000 and overrun == 0
    assert chunk_frame_bytes(chunk) == HEADER_SIZE + 12 + 100_000
    assert (chunk.layer_end, chunk.token_start, chunk.token_end) == (2, 16, 40)
    (frame,) = FrameDecoder().feed(encode_frame(Frame(1, chunk)))  # over the wire
    seg = decode_kv(frame.message.data)
    assert (seg.start, seg.end, seg.tokens) == (16, 40, list(range(16, 40)))
    assert all((seg.keys(i) == cache.slice(16, 40).keys(i)).all() for i in range(2))
    assert all((seg.values(i) == cache.slice(16, 40).values(i)).all() for i in range(2))


def test_kv_payload_larger_than_modeled_is_sent_whole_and_reported():
    model = build_model(ModelConfig(d_model=32, n_layer=2, n_head=2))
    _, cache = model.prefill(list(range(8)))
    data, filler, overrun = encode_kv(cache, 0, 8, modeled_bytes=10)
    assert filler == 0 and len(data) == 10 + overrun and decode_kv(data).length == 8


@pytest.mark.parametrize("data", [b"", b"\x00\x00\x10\x00abc", b"\x00\x00\x00\x03abc"])
def test_malformed_kv_payload_is_a_protocol_error(data):
    with pytest.raises(ProtocolError):
        decode_kv(data)


def test_the_hash_engine_loads_and_its_kv_chunks_are_within_the_limits():
    """model.engine: hash reaches every role's ModelConfig; its KV_CHUNK carries 12 bytes a
    token (id + state), well inside the limits the config checks."""
    from testbed.pdd.compute.hashmodel import HashDecoder
    from testbed.pdd.run.config import kv_chunk_bounds

    cfg = parse_config(_with("model.engine", "hash"))
    assert cfg.model.engine == "hash" and parse_config(GOOD).model.engine == "torch"
    model = build_model(cfg.model)
    assert isinstance(model, HashDecoder)
    _, cache = model.prefill(list(range(cfg.prefill.kv_chunk_tokens)))
    chunk, _ = kv_chunk(cache, 0, cache.end, cfg.timing.modeled_kv_bytes(cache.end))
    real, frame = kv_chunk_bounds(cfg)
    assert len(chunk.data) <= real < kv_chunk_bounds(parse_config(GOOD))[0]
    assert chunk_frame_bytes(chunk) <= frame
    assert decode_kv(chunk.data, "hash").tokens == cache.tokens
