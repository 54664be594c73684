"""Framing of the PDD wire protocol: length-prefixed, checksummed binary frames.

Owns the frame header, ``Frame`` (a request id plus a typed message),
``encode_frame`` / ``encode_frame_parts`` and the streaming ``FrameDecoder``.
Payload classes are in ``messages.py`` and the wire enums in ``wire.py``;
both are re-exported here, so roles import everything from this module.

A frame on the wire is ``header | payload | filler``. Header, 29 bytes,
network byte order (``HEADER_SIZE``)::

  offset size field
  0      2    magic           b"PD"
  2      1    version         2
  3      1    message type    MsgType
  4      1    flags           reserved, must be 0
  5      8    request id      u64 (0 for connection-level messages)
  13     4    payload length  u32
  17     4    filler length   u32: zero bytes after the payload (KV_CHUNK only, else 0)
  21     4    payload CRC32   zlib.crc32 of the payload (not of the filler)
  25     4    header CRC32    zlib.crc32 of bytes 0..24

header + payload + filler <= max_frame_bytes. The filler is what makes a
KV_CHUNK as long as the modeled KV it stands for (``kvpayload.py``): the
network carries every byte of it, but neither side does Python work per
filler byte. A sender sends it from one shared zero buffer
(``filler_views``: no allocation, no copy in Python); a receiver never
buffers it: it checks that each byte is zero as it arrives, with one C-level
compare per received piece (``bytes.startswith`` of a zero buffer, memcmp
speed), which costs about what a NIC's checksum does, and counts it. So a
corrupted filler byte is caught as surely as a CRC would catch it, and the
CRC runs only over the payload's real bytes.

The header has its own CRC so that a corrupted length is caught before the
decoder waits for (or buffers) a payload that will never come. A decoder
checks, in order: magic, version, header CRC, type, flags, the length bounds
of its type (``FrameLimits``),
that only KV_CHUNK announces filler, the payload CRC (as soon as the payload
is in), each filler byte (as it arrives), then that the payload decodes as
its type. The first failure raises ``ProtocolError`` with the frame's stream
offset and the reason; the decoder then stays failed (a byte stream cannot
be resynchronised).

Version 1 (25-byte header, no filler: KV padding was part of the payload
and of its CRC) is not accepted: every role of a cluster runs this code.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Union

from testbed.errors import ProtocolError
from testbed.pdd.wire.messages import (
    MESSAGE_CLASSES,
    Bind,
    Cancel,
    Done,
    Error,
    Handoff,
    HandoffAck,
    Health,
    HealthAck,
    Hello,
    KvChunk,
    KvDone,
    KvNeed,
    KvReady,
    Message,
    Report,
    Request,
    Started,
    Tokens,
    decode_payload,
    fixed_payload_size,
)
from testbed.pdd.wire.fields import ErrorCode, FinishReason, MsgType, Role

__all__ = [  # framing, plus the payload classes and wire enums it re-exports
    "HEADER_SIZE", "MAGIC", "MAX_FRAME_BYTES", "VERSION", "Frame", "FrameDecoder", "FrameLimits",
    "FrameHeader", "decode_frame_body", "encode_frame", "encode_frame_parts", "filler_views",
    "frame_size", "parse_header",
    "MESSAGE_CLASSES", "Message", "decode_payload", "Bind", "Cancel", "Done", "Error", "Handoff",
    "HandoffAck", "Health", "HealthAck", "Hello", "KvChunk", "KvDone", "KvNeed", "KvReady",
    "Report", "Request", "Started", "Tokens", "ErrorCode", "FinishReason", "MsgType", "Role",
]

MAGIC = b"PD"
VERSION = 2
MAX_FRAME_BYTES = 64 * 1024 * 1024  # default bound on header + payload + filler
MAX_BULK_PAYLOAD_BYTES = 32 * 1024 * 1024  # default bound on a KV_CHUNK's buffered real bytes
MAX_CONTROL_PAYLOAD_BYTES = 1024 * 1024  # default bound on any other variable-size payload
_PREFIX = struct.Struct("!2sBBBQIII")  # everything the header CRC covers
_HEADER_CRC = struct.Struct("!I")
HEADER_SIZE = _PREFIX.size + _HEADER_CRC.size  # 29
_MAX_U64 = (1 << 64) - 1
_ZEROS = bytes(1 << 20)  # the one zero buffer every filler is sent from and checked against
_ZERO_VIEW = memoryview(_ZEROS)
_MSG_TYPES: dict[int, MsgType] = {int(t): t for t in MsgType}
_MERGE_BYTES = 64 * 1024  # a first payload part up to this size is sent in one piece with the header

Buffer = Union[bytes, bytearray, memoryview]


@dataclass(frozen=True)
class Frame:
    """One protocol frame: the request it belongs to and its typed message.

    Example: ``Frame(7, Tokens(Role.MAIN_DECODE, 12, (101, 102)))``. The
    filler length is the message's (``KvChunk.filler``; 0 for every other type).
    """

    request_id: int
    message: Message

    def __post_init__(self) -> None:
        rid = self.request_id
        if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid <= _MAX_U64:
            raise ProtocolError(f"request id must be an unsigned 64-bit int, got {rid!r}")
        if not isinstance(self.message, Message):
            raise ProtocolError(f"frame message must be a Message, got {self.message!r}")

    @property
    def msg_type(self) -> MsgType:
        return self.message.MSG_TYPE


@dataclass(frozen=True)
class FrameHeader:
    """A parsed and validated header (what ``parse_header`` returns)."""

    msg_type: MsgType
    request_id: int
    payload_len: int
    payload_crc: int
    filler_len: int = 0


@dataclass(frozen=True)
class FrameLimits:
    """What a decoder accepts, by message type, checked on the header before anything
    is reserved (``parse_header``):

    - every frame: header + payload + filler <= ``max_frame_bytes``;
    - a fixed-layout type (KV_DONE, HEALTH, CANCEL...): exactly its layout's size;
    - KV_CHUNK (the one bulk type): payload (the real bytes, which are buffered)
      <= ``max_bulk_payload_bytes``; its filler is checked and dropped, never buffered;
    - any other type (HELLO, REQUEST, TOKENS, HANDOFF, ERROR, REPORT):
      payload <= ``max_control_payload_bytes``;
    - ``first_types``, when set: the stream's first frame must be one of these
      (a connection must identify itself with HELLO before anything else is
      buffered). ``check(..., first=True)`` applies it.

    >>> FrameLimits().payload_limit(MsgType.HEALTH)
    8
    """

    max_frame_bytes: int = MAX_FRAME_BYTES
    max_bulk_payload_bytes: int = MAX_BULK_PAYLOAD_BYTES
    max_control_payload_bytes: int = MAX_CONTROL_PAYLOAD_BYTES
    first_types: frozenset[MsgType] | None = None

    def __post_init__(self) -> None:
        if self.max_frame_bytes < HEADER_SIZE:
            raise ValueError(f"max_frame_bytes must be >= {HEADER_SIZE}, "
                             f"got {self.max_frame_bytes}")
        for name in ("max_bulk_payload_bytes", "max_control_payload_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def payload_limit(self, msg_type: MsgType) -> int:
        """The largest payload a ``msg_type`` frame may announce."""
        cls = MESSAGE_CLASSES[msg_type]
        if (size := _FIXED_SIZES[msg_type]) is not None:
            return size
        return self.max_bulk_payload_bytes if cls.BULK else self.max_control_payload_bytes

    def check(self, msg_type: MsgType, length: int, filler: int, first: bool = False) -> None:
        """ProtocolError if a ``msg_type`` header announcing these lengths is refused
        (``first``: it is the stream's first frame)."""
        if first and self.first_types is not None and msg_type not in self.first_types:
            expected = " or ".join(sorted(t.name for t in self.first_types))
            raise ProtocolError(f"{msg_type.name} as the first frame (expected {expected})")
        if HEADER_SIZE + length + filler > self.max_frame_bytes:
            raise ProtocolError(f"{msg_type.name} frame of {HEADER_SIZE + length + filler} bytes "
                                f"exceeds max_frame_bytes={self.max_frame_bytes}")
        if (size := _FIXED_SIZES[msg_type]) is not None:
            if length != size:
                raise ProtocolError(f"{msg_type.name} frame announces a {length}-byte payload; "
                                    f"its layout is exactly {size} bytes")
        elif length > (limit := self.payload_limit(msg_type)):
            raise ProtocolError(f"{msg_type.name} frame announces a {length}-byte payload; "
                                f"at most {limit} accepted for this type")


_FIXED_SIZES: dict[MsgType, int | None] = {t: fixed_payload_size(c)
                                           for t, c in MESSAGE_CLASSES.items()}


def filler_views(n: int) -> list[memoryview]:
    """``n`` zero bytes as read-only views of one shared buffer (nothing is allocated).

    >>> sum(map(len, filler_views(3_000_000)))
    3000000
    """
    full, rest = divmod(n, len(_ZEROS))
    return [_ZERO_VIEW] * full + ([_ZERO_VIEW[:rest]] if rest else [])


def frame_size(message: Message) -> int:
    """Wire bytes of a frame carrying ``message`` (header + payload + filler), not encoding
    a bulk payload's data: ``frame_size(KvChunk(0, 4, 0, 64, data, filler=n))``."""
    return HEADER_SIZE + message.payload_size() + message.filler


def encode_frame_parts(frame: Frame,
                       max_frame_bytes: int = MAX_FRAME_BYTES) -> tuple[list[Buffer], int]:
    """Serialise ``frame`` without joining it: (header and payload buffers, filler length).

    The buffers are sent in order, then ``filler`` zero bytes (``filler_views``).
    A bulk payload's data (KV_CHUNK's real KV bytes) is one of the buffers as
    it is, not copied. ProtocolError if the frame would exceed ``max_frame_bytes``.
    """
    msg = frame.message
    parts = msg.encode_parts()
    size = sum(len(p) for p in parts)
    filler = msg.filler
    if HEADER_SIZE + size + filler > max_frame_bytes:
        raise ProtocolError(f"{frame.msg_type.name} frame of {HEADER_SIZE + size + filler} "
                            f"bytes exceeds max_frame_bytes={max_frame_bytes}")
    crc = 0
    for p in parts:
        crc = zlib.crc32(p, crc)
    prefix = _PREFIX.pack(MAGIC, VERSION, frame.msg_type, 0, frame.request_id, size, filler, crc)
    head = prefix + _HEADER_CRC.pack(zlib.crc32(prefix))
    if parts and len(parts[0]) <= _MERGE_BYTES:
        return [head + parts[0], *parts[1:]], filler
    return [head, *parts], filler


def encode_frame(frame: Frame, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Serialise ``frame`` into one bytes object, filler included (tests, fault injection);
    ProtocolError if it would exceed ``max_frame_bytes``.

    >>> len(encode_frame(Frame(1, KvReady(64))))
    33
    """
    parts, filler = encode_frame_parts(frame, max_frame_bytes)
    return b"".join(parts + filler_views(filler))


def _check_magic_version(head: bytes | bytearray) -> None:
    """Check magic and version on however many header bytes have arrived."""
    magic = bytes(head[:2])
    if magic != MAGIC[: len(magic)]:
        raise ProtocolError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if len(head) >= 3 and head[2] != VERSION:
        raise ProtocolError(f"unsupported version {head[2]}, this side speaks {VERSION}")


def parse_header(head: bytes | bytearray, max_frame_bytes: int = MAX_FRAME_BYTES,
                 limits: FrameLimits | None = None, first: bool = False) -> FrameHeader:
    """Validate the first ``HEADER_SIZE`` bytes of ``head``; ProtocolError says what is wrong.

    ``limits`` (default: ``FrameLimits(max_frame_bytes)``) bounds the announced lengths
    by message type.

    >>> parse_header(encode_frame(Frame(3, Cancel()))).request_id
    3
    """
    if len(head) < HEADER_SIZE:
        raise ProtocolError(f"truncated header: {len(head)} of {HEADER_SIZE} bytes")
    _check_magic_version(head)
    _, _, type_byte, flags, rid, length, filler, payload_crc = _PREFIX.unpack_from(head)
    (header_crc,) = _HEADER_CRC.unpack_from(head, _PREFIX.size)
    actual_crc = zlib.crc32(head[: _PREFIX.size])
    if header_crc != actual_crc:
        raise ProtocolError(f"header checksum mismatch: header says {header_crc:#010x}, "
                            f"computed {actual_crc:#010x}")
    msg_type = _MSG_TYPES.get(type_byte)
    if msg_type is None:
        raise ProtocolError(f"unknown message type {type_byte}")
    if flags != 0:
        raise ProtocolError(f"{msg_type.name} frame has reserved flags {flags:#04x} set")
    (limits or FrameLimits(max_frame_bytes)).check(msg_type, length, filler, first)
    if filler and not MESSAGE_CLASSES[msg_type].BULK:
        raise ProtocolError(f"{msg_type.name} frame announces {filler} filler bytes; "
                            "only KV_CHUNK frames carry filler")
    return FrameHeader(msg_type, rid, length, payload_crc, filler)


def _check_payload_crc(header: FrameHeader, payload: Buffer) -> None:
    crc = zlib.crc32(payload)
    if crc != header.payload_crc:
        raise ProtocolError(f"{header.msg_type.name} payload checksum mismatch: header says "
                            f"{header.payload_crc:#010x}, computed {crc:#010x}")


def decode_frame_body(header: FrameHeader, payload: Buffer) -> Frame:
    """Check the payload's CRC and decode it as ``header.msg_type`` (filler from the header).

    A bulk payload (KV_CHUNK) is decoded without copying: the message's data is
    a read-only view of ``payload``, which the caller must not modify afterwards.
    """
    _check_payload_crc(header, payload)
    return Frame(header.request_id, decode_payload(header.msg_type, payload, header.filler_len))


def _NO_FAST(length: int) -> bool:
    return False


def _decoded_frame(request_id: int, message: Message) -> Frame:
    """A Frame of a decoded header's request id (a u64 by its layout) and a decoded
    message: what ``Frame.__post_init__`` checks holds already."""
    frame = object.__new__(Frame)
    object.__setattr__(frame, "request_id", request_id)
    object.__setattr__(frame, "message", message)
    return frame


def _zero_prefix_len(data: Buffer, pos: int, n: int) -> int:
    """How many of ``data[pos:pos + n]`` are zero from the start: n when all are (C speed)."""
    done = 0
    while done < n:
        take = min(n - done, len(_ZEROS))
        if not data.startswith(_ZERO_VIEW[:take], pos + done):  # a memcmp
            piece = bytes(data[pos + done: pos + done + take])  # error path only
            return done + take - len(piece.lstrip(b"\x00"))
        done += take
    return n


class FrameDecoder:
    """Turns a byte stream into validated frames, whatever the chunking.

    ``feed`` returns every frame completed so far. When the stream holds a bad
    frame, ``feed`` raises ``ProtocolError``; if good frames preceded it in the
    same call they are returned first and the error is raised by the next call
    (``error`` is set at once). Once failed, every call raises that error.
    Call ``eof()`` when the stream ends: it raises if a frame was cut short.

    ``feed(data, max_frames=n)`` stops after n frames and keeps the rest of
    ``data`` (a copy) for the next call, which decodes it first (``feed(b"")``
    goes on with it; ``undecoded`` says how many such bytes wait): a reader
    that got hundreds of small frames in one read can handle them in turns.

    ``feed`` keeps no reference to its argument (the caller may reuse the
    buffer): header and payload bytes are copied once, into the frame's own
    buffer; filler bytes are checked in place and only counted. The lengths a
    header announces are checked against ``limits`` (``FrameLimits``: by
    message type) before anything is reserved, and the payload buffer grows
    with the bytes that arrive, so a header announcing a large payload that
    never comes costs nothing.

    >>> dec = FrameDecoder()
    >>> data = encode_frame(Frame(9, Health(nonce=1)))
    >>> dec.feed(data[:10]), dec.feed(data[10:])
    ([], [Frame(request_id=9, message=Health(nonce=1))])
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES, limits: FrameLimits | None = None):
        if max_frame_bytes < HEADER_SIZE:
            raise ValueError(f"max_frame_bytes must be >= {HEADER_SIZE}, got {max_frame_bytes}")
        self.limits = limits or FrameLimits(max_frame_bytes)
        self.max_frame_bytes = self.limits.max_frame_bytes
        self.error: ProtocolError | None = None
        self.frames_decoded = 0
        self.filler_bytes = 0  # filler bytes checked and dropped, over the whole stream
        self._offset = 0  # stream offset of the current frame's first byte
        self._head = bytearray()  # header bytes of the current frame so far
        self._header: FrameHeader | None = None  # set once the header is complete
        self._payload: bytearray | None = None  # grows as payload bytes arrive
        self._got = 0  # payload bytes received
        self._filler_got = 0  # filler bytes received (checked, not kept)
        self._rest = b""  # bytes fed after the frame a max_frames feed stopped at
        # _whole_frame's length check by type byte (non-bulk types only): what
        # FrameLimits.check accepts after the stream's first frame
        self._fast_limits = {int(t): self._length_ok(t) for t in MsgType
                             if not MESSAGE_CLASSES[t].BULK}

    def _length_ok(self, msg_type: MsgType):
        limit = min(self.limits.payload_limit(msg_type), self.max_frame_bytes - HEADER_SIZE)
        if _FIXED_SIZES[msg_type] is not None:
            return limit.__eq__ if limit == _FIXED_SIZES[msg_type] else _NO_FAST
        return limit.__ge__

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames: those of the current, incomplete
        frame (filler counted, not kept) and any not decoded yet (``undecoded``)."""
        return len(self._head) + self._got + self._filler_got + len(self._rest)

    @property
    def undecoded(self) -> int:
        """Bytes a ``max_frames`` feed left for the next call."""
        return len(self._rest)

    def feed(self, data: Buffer, max_frames: int | None = None) -> list[Frame]:
        """Add ``data``; return the frames it completes, at most ``max_frames`` (see the
        class docstring)."""
        if self.error is not None:
            raise self.error
        if self._rest:
            data, self._rest = self._rest + bytes(data), b""
        elif isinstance(data, memoryview):
            data = bytes(data)  # the filler check needs bytes' startswith; rare path
        frames: list[Frame] = []
        pos = 0
        view = memoryview(data)
        try:
            while (found := self._advance(data, view, pos)) is not None:
                frame, pos = found
                frames.append(frame)
                if max_frames is not None and len(frames) >= max_frames:
                    if pos < len(data):
                        self._rest = bytes(view[pos:])
                    break
        except ProtocolError as err:
            self._fail(err)
            if not frames:
                raise self.error from None
        finally:
            view.release()
        return frames

    def eof(self) -> None:
        """The stream ended: ProtocolError if it stopped inside a frame."""
        if self.error is not None:
            raise self.error
        if self.buffered:
            self._fail(ProtocolError(f"stream ended inside a frame: {self.buffered} bytes "
                                     "of an incomplete frame (truncated header, payload or "
                                     "filler)"))
            raise self.error

    def _advance(self, data: bytes | bytearray, view: memoryview,
                 pos: int) -> tuple[Frame, int] | None:
        """Consume ``data[pos:]`` up to the end of the current frame.

        Returns the frame and the position after it, or None once ``data`` is
        used up without completing a frame (its bytes are kept for later).
        """
        end = len(data)
        if self._header is None and not self._head and end - pos >= HEADER_SIZE:
            whole = self._whole_frame(data, view, pos)
            if whole is not None:
                return whole
        if self._header is None:
            take = min(HEADER_SIZE - len(self._head), end - pos)
            self._head += view[pos: pos + take]
            pos += take
            if len(self._head) < HEADER_SIZE:
                _check_magic_version(self._head)
                return None
            self._header = parse_header(self._head, limits=self.limits,
                                        first=not self.frames_decoded)
            self._payload = bytearray()  # nothing reserved for what has not arrived
            if not self._header.payload_len:
                _check_payload_crc(self._header, self._payload)
        header, payload = self._header, self._payload
        take = min(header.payload_len - self._got, end - pos)
        if take:
            payload += view[pos: pos + take]
            self._got += take
            pos += take
            if self._got == header.payload_len:
                _check_payload_crc(header, payload)  # real bytes: checked before the filler
        if self._got < header.payload_len:
            return None
        take = min(header.filler_len - self._filler_got, end - pos)
        if take:
            zeros = _zero_prefix_len(data, pos, take)
            if zeros < take:
                at = self._filler_got + zeros
                raise ProtocolError(f"{header.msg_type.name} filler byte {at} of "
                                    f"{header.filler_len} is {data[pos + zeros]:#04x}, not zero")
            self._filler_got += take
            pos += take
        if self._filler_got < header.filler_len:
            return None
        frame = _decoded_frame(header.request_id,
                               decode_payload(header.msg_type, payload, header.filler_len))
        self.frames_decoded += 1
        self.filler_bytes += header.filler_len
        self._offset += HEADER_SIZE + header.payload_len + header.filler_len
        self._reset()
        return frame, pos

    def _whole_frame(self, data: bytes | bytearray, view: memoryview,
                     pos: int) -> tuple[Frame, int] | None:
        """The common case, a valid non-bulk frame wholly in ``data[pos:]`` (not the
        stream's first): its header checked inline and its payload decoded with one copy.
        None (nothing consumed) for anything else (incomplete, first, bulk, or any check
        failing): the general path then takes it, and raises what is wrong."""
        prefix = data[pos: pos + _PREFIX.size]
        magic, version, type_byte, flags, rid, length, filler, payload_crc = \
            _PREFIX.unpack(prefix)
        start = pos + HEADER_SIZE
        stop = start + length
        if (filler or flags or not self.frames_decoded or stop > len(data)
                or magic != MAGIC or version != VERSION
                or not self._fast_limits.get(type_byte, _NO_FAST)(length)
                or _HEADER_CRC.unpack_from(data, pos + _PREFIX.size)[0] != zlib.crc32(prefix)):
            return None
        payload = data[start:stop] if isinstance(data, bytes) else bytes(view[start:stop])
        if zlib.crc32(payload) != payload_crc:
            return None
        frame = _decoded_frame(rid, MESSAGE_CLASSES[type_byte].decode(payload))
        self.frames_decoded += 1
        self._offset += HEADER_SIZE + length
        return frame, stop

    def _reset(self) -> None:
        self._head.clear()
        self._header = None
        self._payload = None
        self._got = self._filler_got = 0

    def _fail(self, err: ProtocolError) -> None:
        where = f"frame #{self.frames_decoded + 1} at stream offset {self._offset}"
        self.error = ProtocolError(f"{where}: {err}")
        self._reset()
