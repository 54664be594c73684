"""PDD wire protocol: round trips of every message type and every validation error."""

from __future__ import annotations

import struct
import zlib

import pytest

from testbed.errors import ProtocolError
from testbed.pdd.wire.protocol import (
    HEADER_SIZE,
    MAGIC,
    MESSAGE_CLASSES,
    VERSION,
    Cancel,
    Done,
    Error,
    ErrorCode,
    FinishReason,
    Frame,
    FrameDecoder,
    Handoff,
    HandoffAck,
    Health,
    HealthAck,
    Hello,
    KvChunk,
    KvDone,
    KvNeed,
    Started,
    Bind,
    KvReady,
    MsgType,
    Report,
    Request,
    Role,
    Tokens,
    decode_payload,
    encode_frame,
    encode_frame_parts,
    filler_views,
    frame_size,
    parse_header,
)

SAMPLES = [
    Hello(Role.RELAY_DECODE, "rld0", {"gpu": "A", "slots": 8}),
    Request((1, 2, 3, 0xFFFFFFFF), 16, {"session": "s1", "hit_rate": 0.93}),
    Request((7,), 1),
    KvChunk(0, 32, 1024, 2048, b"\x00\xffkv" * 100),
    KvDone(num_tokens=4096, kv_bytes=50 * 1024 * 4096, num_chunks=4),
    Tokens(Role.PREFILL, 0, (42,)),
    Tokens(Role.MAIN_DECODE, 17, tuple(range(100))),
    Handoff(batch=0, start_position=1, token_ids=(5, 9, 11), final=False),
    Handoff(batch=3, start_position=200, token_ids=(), final=True),
    HandoffAck(batch=3, next_position=200),
    KvReady(num_tokens=65536),
    Done(num_output_tokens=1024, finish_reason=FinishReason.LENGTH),
    Error(ErrorCode.OVERLOADED, "RLD has no free slot"),
    Health(nonce=2**64 - 1),
    HealthAck(nonce=1, active_requests=12, waiting_requests=3),
    Cancel(),
    KvNeed(start=4096, num_tokens=65536),
    Report(Role.MAIN_DECODE, "md0", {"md_hit_rate": 0.9, "kv_wan_bytes": 4096, "batches": [3, 1]}),
    Started(hit_tokens=1024),
    Bind({"pipeline": "p-rld-md", "rld": "rld1", "md": "md2"}),
]


def test_samples_cover_every_message_type():
    assert {m.MSG_TYPE for m in SAMPLES} == set(MsgType) == set(MESSAGE_CLASSES)


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_payload_round_trip(message):
    assert decode_payload(message.MSG_TYPE, message.encode()) == message


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_frame_round_trip_through_decoder(message):
    frame = Frame(2**63 + 5, message)
    data = encode_frame(frame)
    assert len(data) == HEADER_SIZE + len(message.encode())
    assert FrameDecoder().feed(data) == [frame]


def test_decoder_handles_one_byte_at_a_time_and_many_frames_per_feed():
    frames = [Frame(i, m) for i, m in enumerate(SAMPLES)]
    stream = b"".join(encode_frame(f) for f in frames)
    dec = FrameDecoder()
    got = [f for i in range(len(stream)) for f in dec.feed(stream[i: i + 1])]
    assert got == frames and dec.buffered == 0
    assert FrameDecoder().feed(stream) == frames


def test_tokens_and_handoff_are_packed_u32_arrays():
    payload = Tokens(Role.RELAY_DECODE, 9, (1, 2)).encode()
    assert payload == struct.pack("!BIII", Role.RELAY_DECODE, 9, 1, 2)
    handoff = Handoff(1, 10, tuple(range(100)), final=True)
    assert len(handoff.encode()) == 9 + 4 * 100  # 100 token ids ~ 0.4 KB on the wire
    assert handoff.end_position == 110


def _raw(msg_type=MsgType.KV_READY, payload=b"\x00\x00\x00\x01", *, magic=MAGIC,
         version=VERSION, flags=0, length=None, filler=0, filler_bytes=None, payload_crc=None,
         header_crc=None):
    """A frame built by hand, so each field can be made wrong on its own."""
    length = len(payload) if length is None else length
    crc = zlib.crc32(payload) if payload_crc is None else payload_crc
    prefix = struct.pack("!2sBBBQIII", magic, version, msg_type, flags, 1, length, filler, crc)
    hcrc = zlib.crc32(prefix) if header_crc is None else header_crc
    return prefix + struct.pack("!I", hcrc) + payload + (
        bytes(filler) if filler_bytes is None else filler_bytes)


def test_raw_helper_builds_a_valid_frame():
    assert FrameDecoder().feed(_raw()) == [Frame(1, KvReady(1))]


_KV_FIXED = struct.pack("!HHII", 0, 1, 0, 1)

BAD_FRAMES = [
    ("bad magic", _raw(magic=b"GE"), "bad magic b'GE'"),
    ("bad version", _raw(version=1), "unsupported version 1"),
    ("unknown type", _raw(msg_type=99), "unknown message type 99"),
    ("type zero", _raw(msg_type=0), "unknown message type 0"),
    ("reserved flags", _raw(flags=0x80), "reserved flags 0x80"),
    ("header checksum", _raw(header_crc=0), "header checksum mismatch"),
    ("payload checksum", _raw(payload_crc=0), "KV_READY payload checksum mismatch"),
    ("too large", _raw(length=2**32 - 1, payload=b""), "exceeds max_frame_bytes"),
    ("fixed size wrong", _raw(payload=b"\x00\x00\x01"),
     "KV_READY frame announces a 3-byte payload; its layout is exactly 4 bytes"),
    ("ids not u32 aligned", _raw(MsgType.TOKENS, b"\x02" + bytes(4) + bytes(7)),
     "7 bytes of token ids is not a multiple of 4"),
    ("tokens empty", _raw(MsgType.TOKENS, b"\x02" + bytes(4)), "token_ids is empty"),
    ("tokens from router", _raw(MsgType.TOKENS, b"\x04" + bytes(8)),
     "ROUTER does not produce tokens"),
    ("tokens bad role", _raw(MsgType.TOKENS, b"\x09" + bytes(8)), "producer=9 is not a Role"),
    ("tokens overflow", _raw(MsgType.TOKENS, b"\x02" + struct.pack("!I", 2**32 - 1) + bytes(8)),
     "overflow u32"),
    ("handoff final flag", _raw(MsgType.HANDOFF, bytes(8) + b"\x02"),
     "final flag must be 0 or 1, got 2"),
    ("kv chunk short", _raw(MsgType.KV_CHUNK, bytes(5)), "5 bytes, need at least 12"),
    ("filler on a non-kv frame", _raw(MsgType.TOKENS, b"\x02" + bytes(8), filler=3),
     "TOKENS frame announces 3 filler bytes; only KV_CHUNK frames carry filler"),
    ("filler byte not zero", _raw(MsgType.KV_CHUNK, _KV_FIXED + b"kv", filler=5,
                                  filler_bytes=b"\0\0\0\x10\0"),
     "KV_CHUNK filler byte 3 of 5 is 0x10, not zero"),
    ("kv payload checksum", _raw(MsgType.KV_CHUNK, _KV_FIXED + b"kv", filler=5, payload_crc=7),
     "KV_CHUNK payload checksum mismatch"),
    ("kv chunk empty range", _raw(MsgType.KV_CHUNK, struct.pack("!HHII", 4, 4, 0, 8)),
     "empty range"),
    ("request count", _raw(MsgType.REQUEST, struct.pack("!III", 8, 3, 1) + b"{}"),
     "3 prompt ids announced, 6 bytes left"),
    ("request json", _raw(MsgType.REQUEST, struct.pack("!III", 8, 1, 1) + b"{x"),
     "invalid JSON"),
    ("request no tokens", _raw(MsgType.REQUEST, struct.pack("!II", 8, 0) + b"{}"),
     "prompt_token_ids is empty"),
    ("hello not utf-8", _raw(MsgType.HELLO, b"\xff\xfe"), "invalid JSON"),
    ("hello deep json", _raw(MsgType.HELLO, b"[" * 100_000), "invalid JSON"),
    ("hello not object", _raw(MsgType.HELLO, b"[1]"), "JSON must be an object, got list"),
    ("hello unknown role", _raw(MsgType.HELLO, b'{"role":"GPU","name":"x","info":{}}'),
     "unknown role 'GPU'"),
    ("hello missing name", _raw(MsgType.HELLO, b'{"role":"CLIENT","info":{}}'),
     "lacks 'name'"),
    ("error code type", _raw(MsgType.ERROR, b'{"code":true,"reason":"x"}'),
     "'code' must be int"),
    ("error code unknown", _raw(MsgType.ERROR, b'{"code":77,"reason":"x"}'),
     "code=77 is not a ErrorCode"),
    ("done reason", _raw(MsgType.DONE, struct.pack("!IB", 3, 9)),
     "finish_reason=9 is not a FinishReason"),
    ("cancel with payload", _raw(MsgType.CANCEL, b"x"),
     "CANCEL frame announces a 1-byte payload; its layout is exactly 0 bytes"),
    ("kv need short", _raw(MsgType.KV_NEED, bytes(4)),
     "KV_NEED frame announces a 4-byte payload; its layout is exactly 8 bytes"),
    ("kv need past end", _raw(MsgType.KV_NEED, struct.pack("!II", 9, 8)), "start 9 > num_tokens 8"),
    ("report unknown role", _raw(MsgType.REPORT, b'{"role":"GPU","name":"x","data":{}}'),
     "unknown role 'GPU'"),
    ("report data not object", _raw(MsgType.REPORT, b'{"role":"ROUTER","name":"r","data":[]}'),
     "'data' must be dict"),
]


@pytest.mark.parametrize("data, reason", [b[1:] for b in BAD_FRAMES],
                         ids=[b[0] for b in BAD_FRAMES])
def test_decoder_rejects_bad_frame_with_precise_reason(data, reason):
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match="frame #1 at stream offset 0") as exc:
        dec.feed(data)
    assert reason in str(exc.value)
    with pytest.raises(ProtocolError):  # stays failed, even on valid input
        dec.feed(encode_frame(Frame(1, Cancel())))
    with pytest.raises(ProtocolError):
        dec.eof()


@pytest.mark.parametrize("data, reason", [b[1:] for b in BAD_FRAMES],
                         ids=[b[0] for b in BAD_FRAMES])
@pytest.mark.parametrize("whole", [True, False], ids=["whole", "in-pieces"])
def test_a_bad_frame_after_a_good_one_fails_alike_whole_or_in_pieces(data, reason, whole):
    # a frame wholly in one read after the first takes the decoder's fast path; one whose
    # header and payload arrive apart takes the general one: the same frames, then the
    # same error
    good = encode_frame(Frame(5, Tokens(Role.MAIN_DECODE, 3, (7,))))
    pieces = [good + data] if whole else [good, data[:HEADER_SIZE], data[HEADER_SIZE:]]
    dec, got = FrameDecoder(), []
    with pytest.raises(ProtocolError) as exc:
        for piece in pieces:
            got += dec.feed(piece)
        dec.feed(b"")
        dec.eof()
    assert got == [Frame(5, Tokens(Role.MAIN_DECODE, 3, (7,)))]
    assert f"frame #2 at stream offset {len(good)}" in str(exc.value)
    assert reason in str(exc.value)


def test_decoded_tokens_encode_to_the_same_bytes_and_move_by_at():
    sent = Frame(3, Tokens(Role.RELAY_DECODE, 10, (5, 2**32 - 1, 0)))
    (got,) = FrameDecoder().feed(encode_frame(Frame(1, Cancel())) + encode_frame(sent))[1:]
    assert got == sent and encode_frame(got) == encode_frame(sent)
    moved = got.message.at(14)
    assert moved == Tokens(Role.RELAY_DECODE, 14, (5, 2**32 - 1, 0))
    assert moved.encode() == Tokens(Role.RELAY_DECODE, 14, (5, 2**32 - 1, 0)).encode()
    assert got.message.at(10) is got.message
    with pytest.raises(ProtocolError, match="overflow u32"):
        got.message.at(2**32 - 2)


def test_oversized_length_is_rejected_from_the_header_alone():
    dec = FrameDecoder(max_frame_bytes=1024)
    header = _raw(MsgType.KV_CHUNK, payload=b"", length=2000)
    reason = f"KV_CHUNK frame of {HEADER_SIZE + 2000} bytes exceeds max_frame_bytes=1024"
    with pytest.raises(ProtocolError, match=reason):
        dec.feed(header)


def test_garbage_is_rejected_before_a_full_header_arrives():
    with pytest.raises(ProtocolError, match="bad magic"):
        FrameDecoder().feed(b"GET")
    with pytest.raises(ProtocolError, match="unsupported version 7"):
        FrameDecoder().feed(MAGIC + b"\x07")


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 3])
def test_truncated_frame_is_reported_at_end_of_stream(cut):
    data = encode_frame(Frame(4, Tokens(Role.MAIN_DECODE, 0, (1, 2, 3))))
    dec = FrameDecoder()
    assert dec.feed(data[:cut]) == []
    assert dec.buffered == cut
    with pytest.raises(ProtocolError, match=f"stream ended inside a frame: {cut} bytes"):
        dec.eof()


def test_clean_end_of_stream_is_not_an_error():
    dec = FrameDecoder()
    dec.feed(encode_frame(Frame(1, Cancel())))
    dec.eof()


def test_frames_before_a_bad_one_are_returned_then_the_error_is_raised():
    good = encode_frame(Frame(1, KvReady(3)))
    dec = FrameDecoder()
    assert dec.feed(good + good + _raw(flags=1)) == [Frame(1, KvReady(3))] * 2
    assert dec.error is not None
    assert f"frame #3 at stream offset {2 * len(good)}" in str(dec.error)
    with pytest.raises(ProtocolError, match="reserved flags"):
        dec.feed(b"")


def test_encode_refuses_a_frame_over_the_limit():
    frame = Frame(1, KvChunk(0, 1, 0, 1, bytes(2000)))
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=1024"):
        encode_frame(frame, max_frame_bytes=1024)
    assert len(encode_frame(frame, max_frame_bytes=HEADER_SIZE + 2012)) == HEADER_SIZE + 2012


def test_parse_header_reads_the_fields():
    header = parse_header(_raw(MsgType.KV_READY))
    assert (header.msg_type, header.request_id, header.payload_len) == (MsgType.KV_READY, 1, 4)


@pytest.mark.parametrize("build, reason", [
    (lambda: Frame(-1, Cancel()), "request id"),
    (lambda: Frame(2**64, Cancel()), "request id"),
    (lambda: Frame(1, b"raw"), "must be a Message"),
    (lambda: Tokens(Role.MAIN_DECODE, 0, (-1,)), "unsigned 32-bit"),
    (lambda: Tokens(Role.MAIN_DECODE, 0, (2**32,)), "unsigned 32-bit"),
    (lambda: Tokens(Role.MAIN_DECODE, 2**32 - 2, (1, 2)), "overflow u32"),
    (lambda: Handoff(0, 0, (1,), final=1), "final must be a bool"),
    (lambda: KvChunk(0, 70000, 0, 1, b""), "layer_end must be an unsigned 16-bit"),
    (lambda: KvReady(True), "num_tokens must be an unsigned 32-bit int"),
    (lambda: Request((1,), 0), "max_output_tokens must be >= 1"),
    (lambda: Hello(Role.CLIENT, ""), "name must be a non-empty str"),
    (lambda: Hello(Role.CLIENT, "c", {"x": object()}).encode(), "not JSON-serialisable"),
])
def test_messages_validate_fields_when_built(build, reason):
    with pytest.raises(ProtocolError, match=reason):
        build()


def test_list_token_ids_are_stored_as_tuples():
    assert Tokens(Role.PREFILL, 0, [1, 2]).token_ids == (1, 2)
    assert Request([4, 5], 2).prompt_token_ids == (4, 5)


# -- KV_CHUNK filler: sent from a shared zero buffer, zero-checked and dropped on receive --

FILLED = Frame(3, KvChunk(0, 4, 64, 128, b"real kv bytes" * 50, filler=3_000_000))


def test_filler_frame_round_trip_whatever_the_chunking():
    data = encode_frame(FILLED)
    assert len(data) == HEADER_SIZE + 12 + 650 + 3_000_000
    assert frame_size(FILLED.message) == len(data)
    for piece in (1 << 20, 256 * 1024, 4093, len(data)):
        dec = FrameDecoder()
        got = [f for i in range(0, len(data), piece) for f in dec.feed(data[i: i + piece])]
        assert got == [FILLED] and dec.buffered == 0 and dec.filler_bytes == 3_000_000
        dec.eof()


def test_filler_is_neither_materialised_nor_copied_when_sending():
    data = bytearray(b"real kv bytes" * 50)
    parts, filler = encode_frame_parts(Frame(3, KvChunk(0, 4, 64, 128, data, filler=3_000_000)))
    assert filler == 3_000_000
    assert any(p is data for p in parts)  # the real bytes go out as they are
    views = filler_views(filler)
    assert sum(map(len, views)) == filler and len({id(v.obj) for v in views}) == 1
    assert b"".join(parts + views) == encode_frame(FILLED)


def test_decoded_kv_data_is_a_read_only_view_of_the_payload():
    (frame,) = FrameDecoder().feed(encode_frame(FILLED))
    data = frame.message.data
    assert isinstance(data, memoryview) and data.readonly and data == FILLED.message.data


def test_decoder_keeps_no_reference_to_the_fed_buffer():
    data = bytearray(encode_frame(FILLED))
    dec = FrameDecoder()
    assert dec.feed(data[:1000]) == []
    buf = bytearray(data[1000:])
    (frame,) = dec.feed(buf)
    buf[:] = bytes(len(buf))  # the caller reuses its buffer: the frame must not change
    assert frame == FILLED


def test_payload_corruption_is_caught_before_the_filler_arrives():
    data = bytearray(encode_frame(FILLED))
    data[HEADER_SIZE + 20] ^= 0x01  # a real KV byte
    with pytest.raises(ProtocolError, match="KV_CHUNK payload checksum mismatch"):
        FrameDecoder().feed(bytes(data[: HEADER_SIZE + 12 + 650]))


@pytest.mark.parametrize("at", [0, 1, 1 << 20, 3_000_000 - 1])
def test_a_corrupted_filler_byte_is_caught_with_its_offset(at):
    data = bytearray(encode_frame(FILLED))
    data[HEADER_SIZE + 12 + 650 + at] = 0x80
    dec = FrameDecoder()
    with pytest.raises(ProtocolError, match=f"KV_CHUNK filler byte {at} of 3000000 is 0x80"):
        for i in range(0, len(data), 256 * 1024):
            dec.feed(bytes(data[i: i + 256 * 1024]))


def test_stream_cut_inside_the_filler_is_reported():
    data = encode_frame(FILLED)
    dec = FrameDecoder()
    assert dec.feed(data[:-10]) == []
    assert dec.buffered == len(data) - 10
    with pytest.raises(ProtocolError, match="stream ended inside a frame"):
        dec.eof()


def test_the_frame_bound_counts_the_filler():
    frame = Frame(1, KvChunk(0, 1, 0, 1, b"x", filler=5000))
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=4096"):
        encode_frame_parts(frame, max_frame_bytes=4096)
    with pytest.raises(ProtocolError, match="exceeds max_frame_bytes=4096"):
        FrameDecoder(max_frame_bytes=4096).feed(encode_frame(frame)[:HEADER_SIZE])


def test_only_kv_chunk_payloads_take_filler():
    with pytest.raises(ProtocolError, match="only KV_CHUNK carries filler"):
        decode_payload(MsgType.KV_READY, b"\x00\x00\x00\x07", filler=1)
    with pytest.raises(ProtocolError, match="filler must be an unsigned 32-bit"):
        KvChunk(0, 1, 0, 1, b"", filler=-1)


def test_a_capped_feed_keeps_the_rest_and_decodes_it_first_next_time():
    frames = [Frame(i, Health(nonce=i)) for i in range(1, 8)]
    stream = b"".join(encode_frame(f) for f in frames)
    dec = FrameDecoder()
    cut = len(stream) - 5  # the last frame arrives in two reads
    assert dec.feed(stream[:cut], max_frames=3) == frames[:3]
    assert dec.undecoded > 0 and dec.buffered >= dec.undecoded
    assert dec.feed(b"", max_frames=3) == frames[3:6]
    assert dec.feed(stream[cut:], max_frames=3) == frames[6:]
    assert dec.undecoded == 0 and dec.buffered == 0


def test_bind_needs_a_pipeline_and_an_object():
    with pytest.raises(ProtocolError, match="BIND.*metadata.pipeline must be a str, got None"):
        Bind({"md": "md1"})
    with pytest.raises(ProtocolError, match="JSON must be an object"):
        decode_payload(MsgType.BIND, b"[1]")
    with pytest.raises(ProtocolError, match="STARTED"):
        decode_payload(MsgType.STARTED, b"\x00\x01")
