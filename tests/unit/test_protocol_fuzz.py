"""Fuzzing the PDD frame decoder: any input yields frames or ProtocolError, nothing else."""

from __future__ import annotations

import struct
import zlib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.errors import ProtocolError
from testbed.pdd.wire.protocol import (
    MAGIC,
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
    KvReady,
    Message,
    MsgType,
    Request,
    Role,
    Tokens,
    decode_payload,
    encode_frame,
)

u8, u16, u32, u64 = (st.integers(0, 2**b - 1) for b in (8, 16, 32, 64))
ids = st.lists(u32, max_size=40).map(tuple)
json_obj = st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.booleans(), u32,
                                                          st.text(max_size=8)), max_size=4)
producers = st.sampled_from([Role.PREFILL, Role.RELAY_DECODE, Role.MAIN_DECODE])


@st.composite
def _range(draw, bound):
    start = draw(st.integers(0, bound - 1))
    return start, draw(st.integers(start + 1, bound))


@st.composite
def kv_chunks(draw):
    layers, tokens = draw(_range(2**16 - 1)), draw(_range(2**32 - 1))
    filler = draw(st.one_of(st.just(0), st.integers(1, 3000)))
    return KvChunk(*layers, *tokens, draw(st.binary(max_size=300)), filler)


messages = st.one_of(
    st.builds(Hello, st.sampled_from(Role), st.text(min_size=1, max_size=10), json_obj),
    st.builds(Request, st.lists(u32, min_size=1, max_size=40), st.integers(1, 2**32 - 1),
              json_obj),
    kv_chunks(),
    st.builds(KvDone, u32, u64, u32),
    st.builds(Tokens, producers, st.integers(0, 2**31), ids.filter(bool)),
    st.builds(Handoff, u32, st.integers(0, 2**31), ids, st.booleans()),
    st.builds(HandoffAck, u32, u32),
    st.builds(KvReady, u32),
    st.builds(Done, u32, st.sampled_from(FinishReason)),
    st.builds(Error, st.sampled_from(ErrorCode), st.text(max_size=30)),
    st.builds(Health, u64),
    st.builds(HealthAck, u64, u32, u32),
    st.just(Cancel()),
)
frames = st.builds(Frame, u64, messages)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _feed_all(decoder: FrameDecoder, chunks: list[bytes]) -> list[Frame]:
    """Feed every chunk, then end the stream; return the frames or raise ProtocolError."""
    out: list[Frame] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    decoder.eof()
    return out


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


@FUZZ
@given(st.lists(st.binary(max_size=64), max_size=8))
def test_random_bytes_give_frames_or_protocol_error(chunks):
    try:
        _feed_all(FrameDecoder(max_frame_bytes=4096), chunks)
    except ProtocolError:
        pass


@FUZZ
@given(st.sampled_from(MsgType), u8, st.binary(max_size=64), st.integers(0, 40),
       st.binary(max_size=4))
def test_random_payload_after_a_valid_header_gives_frames_or_protocol_error(
        msg_type, flags, payload, filler, filler_junk):
    """Random bytes rarely pass the CRCs; here they do, so payload decoders get fuzzed too
    (and the filler: announced on any type, sometimes not all zero)."""
    prefix = struct.pack("!2sBBBQIII", MAGIC, VERSION, msg_type, flags % 2, 1, len(payload),
                         filler, zlib.crc32(payload))
    tail = (bytes(filler) + filler_junk)[:filler]
    data = prefix + struct.pack("!I", zlib.crc32(prefix)) + payload + tail
    try:
        got = _feed_all(FrameDecoder(), [data])
    except ProtocolError:
        return
    assert flags % 2 == 0 and len(got) == 1 and got[0].msg_type == msg_type
    assert not any(tail) and (filler == 0 or msg_type == MsgType.KV_CHUNK)


@FUZZ
@given(st.sampled_from(MsgType), st.binary(max_size=80))
def test_decode_payload_gives_a_message_or_protocol_error(msg_type, payload):
    try:
        message = decode_payload(msg_type, payload)
    except ProtocolError:
        return
    assert isinstance(message, Message) and message.MSG_TYPE == msg_type


@FUZZ
@given(st.lists(frames, min_size=1, max_size=6), st.lists(st.integers(0, 10**6), max_size=12))
def test_valid_frames_split_anywhere_decode_exactly(sent, cuts):
    stream = b"".join(encode_frame(f) for f in sent)
    assert _feed_all(FrameDecoder(), _split(stream, cuts)) == sent


@FUZZ
@given(st.lists(frames, min_size=1, max_size=4), st.integers(0, 10**9),
       st.lists(st.integers(0, 10**6), max_size=6))
def test_a_flipped_bit_is_always_detected(sent, bit, cuts):
    """Every field is covered by magic/version checks or a CRC32, which catches 1-bit errors."""
    stream = bytearray(b"".join(encode_frame(f) for f in sent))
    bit %= 8 * len(stream)
    stream[bit // 8] ^= 1 << (bit % 8)
    decoder = FrameDecoder()
    try:
        _feed_all(decoder, _split(bytes(stream), cuts))
    except ProtocolError:
        assert decoder.error is not None
        return
    raise AssertionError(f"bit {bit} flipped without a ProtocolError")


@FUZZ
@given(st.lists(frames, min_size=1, max_size=4), st.binary(min_size=1, max_size=40),
       st.lists(st.integers(0, 10**6), max_size=6))
def test_garbage_after_valid_frames_keeps_the_frames_and_fails(sent, garbage, cuts):
    stream = b"".join(encode_frame(f) for f in sent) + garbage
    decoder, got = FrameDecoder(), []
    try:
        for chunk in _split(stream, cuts):
            got += decoder.feed(chunk)
        decoder.eof()
    except ProtocolError:
        pass
    else:
        got_more = got[len(sent):]
        assert got_more, "garbage was accepted without producing a frame"
    assert got[: len(sent)] == sent


@settings(max_examples=25, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(1, 3 << 20), st.integers(0, 10**9),
       st.integers(1, 1 << 18))
def test_a_flipped_bit_in_a_large_filler_is_detected(data, filler, bit, piece):
    """Fillers span several blocks of the shared zero buffer; any byte of them is checked."""
    stream = bytearray(encode_frame(Frame(1, KvChunk(0, 1, 0, 1, data, filler))))
    start = len(stream) - filler
    bit %= 8 * filler
    stream[start + bit // 8] ^= 1 << (bit % 8)
    decoder = FrameDecoder()
    try:
        _feed_all(decoder, [bytes(stream[i: i + piece]) for i in range(0, len(stream), piece)])
    except ProtocolError as err:
        assert f"filler byte {bit // 8} of {filler}" in str(err)
        return
    raise AssertionError(f"filler bit {bit} flipped without a ProtocolError")
