"""Framing of the PDD wire protocol: length-prefixed, checksummed binary frames.

Owns the frame header, ``Frame`` (a request id plus a typed message),
``encode_frame`` and the streaming ``FrameDecoder``. Payload classes are in
``messages.py`` and the wire enums in ``wire.py``; both are re-exported here,
so roles import everything from this module.

Header, 25 bytes, network byte order (``HEADER``)::

  offset size field
  0      2    magic           b"PD"
  2      1    version         1
  3      1    message type    MsgType
  4      1    flags           reserved, must be 0
  5      8    request id      u64 (0 for connection-level messages)
  13     4    payload length  u32, header + payload <= max_frame_bytes
  17     4    payload CRC32   zlib.crc32 of the payload
  21     4    header CRC32    zlib.crc32 of bytes 0..20

The header has its own CRC so that a corrupted length is caught before the
decoder waits for (or buffers) a payload that will never come. A decoder
checks, in order: magic, version, header CRC, type, flags, length bound,
payload CRC, then that the payload decodes as its type. The first failure
raises ``ProtocolError`` with the frame's stream offset and the reason; the
decoder then stays failed (a byte stream cannot be resynchronised).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from testbed.errors import ProtocolError
from testbed.pdd.messages import (
    MESSAGE_CLASSES,
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
    Tokens,
    decode_payload,
)
from testbed.pdd.wire import ErrorCode, FinishReason, MsgType, Role

__all__ = [  # framing, plus the payload classes and wire enums it re-exports
    "HEADER_SIZE", "MAGIC", "MAX_FRAME_BYTES", "VERSION", "Frame", "FrameDecoder",
    "FrameHeader", "decode_frame_body", "encode_frame", "parse_header",
    "MESSAGE_CLASSES", "Message", "decode_payload", "Cancel", "Done", "Error", "Handoff",
    "HandoffAck", "Health", "HealthAck", "Hello", "KvChunk", "KvDone", "KvNeed", "KvReady",
    "Report", "Request", "Tokens", "ErrorCode", "FinishReason", "MsgType", "Role",
]

MAGIC = b"PD"
VERSION = 1
MAX_FRAME_BYTES = 64 * 1024 * 1024  # default bound on header + payload
_PREFIX = struct.Struct("!2sBBBQII")  # everything the header CRC covers
_HEADER_CRC = struct.Struct("!I")
HEADER_SIZE = _PREFIX.size + _HEADER_CRC.size  # 25
_MAX_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Frame:
    """One protocol frame: the request it belongs to and its typed message.

    Example: ``Frame(7, Tokens(Role.MAIN_DECODE, 12, (101, 102)))``.
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


def encode_frame(frame: Frame, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Serialise ``frame``; ProtocolError if it would exceed ``max_frame_bytes``.

    >>> len(encode_frame(Frame(1, KvReady(64))))
    29
    """
    payload = frame.message.encode()
    if HEADER_SIZE + len(payload) > max_frame_bytes:
        raise ProtocolError(f"{frame.msg_type.name} frame of {HEADER_SIZE + len(payload)} "
                            f"bytes exceeds max_frame_bytes={max_frame_bytes}")
    prefix = _PREFIX.pack(MAGIC, VERSION, frame.msg_type, 0, frame.request_id,
                          len(payload), zlib.crc32(payload))
    return prefix + _HEADER_CRC.pack(zlib.crc32(prefix)) + payload


def _check_magic_version(head: bytes | bytearray) -> None:
    """Check magic and version on however many header bytes have arrived."""
    magic = bytes(head[:2])
    if magic != MAGIC[: len(magic)]:
        raise ProtocolError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if len(head) >= 3 and head[2] != VERSION:
        raise ProtocolError(f"unsupported version {head[2]}, this side speaks {VERSION}")


def parse_header(head: bytes | bytearray, max_frame_bytes: int = MAX_FRAME_BYTES) -> FrameHeader:
    """Validate the first ``HEADER_SIZE`` bytes of ``head``; ProtocolError says what is wrong.

    >>> parse_header(encode_frame(Frame(3, Cancel()))).request_id
    3
    """
    if len(head) < HEADER_SIZE:
        raise ProtocolError(f"truncated header: {len(head)} of {HEADER_SIZE} bytes")
    _check_magic_version(head)
    _, _, type_byte, flags, rid, length, payload_crc = _PREFIX.unpack_from(head)
    (header_crc,) = _HEADER_CRC.unpack_from(head, _PREFIX.size)
    actual_crc = zlib.crc32(head[: _PREFIX.size])
    if header_crc != actual_crc:
        raise ProtocolError(f"header checksum mismatch: header says {header_crc:#010x}, "
                            f"computed {actual_crc:#010x}")
    if type_byte not in MsgType._value2member_map_:
        raise ProtocolError(f"unknown message type {type_byte}")
    msg_type = MsgType(type_byte)
    if flags != 0:
        raise ProtocolError(f"{msg_type.name} frame has reserved flags {flags:#04x} set")
    if HEADER_SIZE + length > max_frame_bytes:
        raise ProtocolError(f"{msg_type.name} frame of {HEADER_SIZE + length} bytes exceeds "
                            f"max_frame_bytes={max_frame_bytes}")
    return FrameHeader(msg_type, rid, length, payload_crc)


def decode_frame_body(header: FrameHeader, payload: bytes) -> Frame:
    """Check the payload's CRC and decode it as ``header.msg_type``."""
    crc = zlib.crc32(payload)
    if crc != header.payload_crc:
        raise ProtocolError(f"{header.msg_type.name} payload checksum mismatch: header says "
                            f"{header.payload_crc:#010x}, computed {crc:#010x}")
    return Frame(header.request_id, decode_payload(header.msg_type, payload))


class FrameDecoder:
    """Turns a byte stream into validated frames, whatever the chunking.

    ``feed`` returns every frame completed so far. When the stream holds a bad
    frame, ``feed`` raises ``ProtocolError``; if good frames preceded it in the
    same call they are returned first and the error is raised by the next call
    (``error`` is set at once). Once failed, every call raises that error.
    Call ``eof()`` when the stream ends: it raises if a frame was cut short.

    >>> dec = FrameDecoder()
    >>> data = encode_frame(Frame(9, Health(nonce=1)))
    >>> dec.feed(data[:10]), dec.feed(data[10:])
    ([], [Frame(request_id=9, message=Health(nonce=1))])
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES):
        if max_frame_bytes < HEADER_SIZE:
            raise ValueError(f"max_frame_bytes must be >= {HEADER_SIZE}, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self.error: ProtocolError | None = None
        self.frames_decoded = 0
        self._offset = 0  # stream offset of the current frame's first byte
        self._head = bytearray()  # header bytes of the current frame so far
        self._header: FrameHeader | None = None  # set once the header is complete
        self._parts: list[bytes] = []  # payload pieces, joined once complete (one copy)
        self._parts_len = 0

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._head) + self._parts_len

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add ``data``; return the frames it completes (see the class docstring)."""
        if self.error is not None:
            raise self.error
        if not isinstance(data, bytes):
            data = bytes(data)  # the decoder keeps slices: they must not change under it
        frames: list[Frame] = []
        pos = 0
        try:
            while (found := self._advance(data, pos)) is not None:
                frame, pos = found
                frames.append(frame)
        except ProtocolError as err:
            self._fail(err)
            if not frames:
                raise self.error from None
        return frames

    def eof(self) -> None:
        """The stream ended: ProtocolError if it stopped inside a frame."""
        if self.error is not None:
            raise self.error
        if self.buffered:
            self._fail(ProtocolError(f"stream ended inside a frame: {self.buffered} bytes "
                                     "of an incomplete frame (truncated header or payload)"))
            raise self.error

    def _advance(self, data: bytes, pos: int) -> tuple[Frame, int] | None:
        """Consume ``data[pos:]`` up to the end of the current frame.

        Returns the frame and the position after it, or None once ``data`` is
        used up without completing a frame (its bytes are kept for later).
        """
        if self._header is None:
            take = min(HEADER_SIZE - len(self._head), len(data) - pos)
            self._head += data[pos: pos + take]
            pos += take
            if len(self._head) < HEADER_SIZE:
                _check_magic_version(self._head)
                return None
            self._header = parse_header(self._head, self.max_frame_bytes)
        header = self._header
        take = min(header.payload_len - self._parts_len, len(data) - pos)
        if take:
            whole = pos == 0 and take == len(data)
            self._parts.append(data if whole else data[pos: pos + take])
            self._parts_len += take
            pos += take
        if self._parts_len < header.payload_len:
            return None
        frame = decode_frame_body(header, b"".join(self._parts))
        self.frames_decoded += 1
        self._offset += HEADER_SIZE + header.payload_len
        self._reset()
        return frame, pos

    def _reset(self) -> None:
        self._head.clear()
        self._header = None
        self._parts.clear()
        self._parts_len = 0

    def _fail(self, err: ProtocolError) -> None:
        where = f"frame #{self.frames_decoded + 1} at stream offset {self._offset}"
        self.error = ProtocolError(f"{where}: {err}")
        self._reset()
