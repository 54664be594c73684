"""Wire enums and field codecs shared by the PDD protocol's payloads.

Owns the byte values that go on the wire for each concept: ``MsgType`` (the
frame header's type byte), ``Role``, ``ErrorCode``, ``FinishReason``; and the
small codecs payloads are built from (unsigned int checks, packed big-endian
u32 arrays, JSON objects, fixed struct prefixes). Every codec failure is a
``ProtocolError`` that names the message type and the field, e.g.
``TOKENS payload: 7 bytes of token ids is not a multiple of 4``.
Payload classes live in ``messages.py``; framing in ``protocol.py``.
"""

from __future__ import annotations

import enum
import json
import struct
import sys
from array import array
from dataclasses import fields
from typing import Any

from testbed.errors import ProtocolError


class MsgType(enum.IntEnum):
    """The frame header's type byte."""

    HELLO = 1
    REQUEST = 2
    KV_CHUNK = 3
    KV_DONE = 4
    TOKENS = 5
    HANDOFF = 6
    HANDOFF_ACK = 7
    KV_READY = 8
    DONE = 9
    ERROR = 10
    HEALTH = 11
    HEALTH_ACK = 12
    CANCEL = 13
    KV_NEED = 14
    REPORT = 15
    STARTED = 16
    BIND = 17


class Role(enum.IntEnum):
    """PDD process roles as they appear on the wire (HELLO, TOKENS producer)."""

    PREFILL = 1
    RELAY_DECODE = 2
    MAIN_DECODE = 3
    ROUTER = 4
    CLIENT = 5


TOKEN_PRODUCERS = frozenset({Role.PREFILL, Role.RELAY_DECODE, Role.MAIN_DECODE})


class ErrorCode(enum.IntEnum):
    """Why a peer reports an ERROR."""

    PROTOCOL = 1  # the peer sent something this side cannot accept
    OVERLOADED = 2  # no capacity for the request now
    UNKNOWN_REQUEST = 3  # request id not known here
    INTERNAL = 4  # a bug or an unexpected local failure
    UNAVAILABLE = 5  # a downstream role cannot be reached


class FinishReason(enum.IntEnum):
    """Why a request stopped producing tokens (DONE)."""

    LENGTH = 1  # max_output_tokens reached
    STOP = 2  # the model emitted a stop token
    CANCELLED = 3


_U32_CODE = "I" if array("I").itemsize == 4 else "L"
_SWAP = sys.byteorder == "little"
_BITS = {"B": 8, "H": 16, "I": 32, "Q": 64}


def fail(msg_type: MsgType, what: str) -> ProtocolError:
    """The error for a bad ``msg_type`` payload: ``raise fail(t, "why")``."""
    return ProtocolError(f"{msg_type.name} payload: {what}")


def check_uint(msg_type: MsgType, name: str, value: object, bits: int) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << bits
    if not ok:
        raise fail(msg_type, f"{name} must be an unsigned {bits}-bit int, got {value!r}")


def as_enum(msg_type: MsgType, name: str, enum_cls: type[enum.IntEnum], value: object):
    try:
        return enum_cls(value)
    except ValueError:
        raise fail(msg_type, f"{name}={value!r} is not a {enum_cls.__name__}") from None


def pack_u32s(msg_type: MsgType, values: tuple[int, ...]) -> bytes:
    try:
        arr = array(_U32_CODE, values)
    except (OverflowError, TypeError) as err:
        raise fail(msg_type, f"token ids must be unsigned 32-bit ints ({err})") from None
    if _SWAP:
        arr.byteswap()
    return arr.tobytes()


def unpack_u32s(msg_type: MsgType, data: bytes) -> tuple[int, ...]:
    if len(data) % 4:
        raise fail(msg_type, f"{len(data)} bytes of token ids is not a multiple of 4")
    arr = array(_U32_CODE)
    arr.frombytes(data)
    if _SWAP:
        arr.byteswap()
    return tuple(arr)


def split(msg_type: MsgType, layout: struct.Struct, payload: bytes) -> tuple[tuple, bytes]:
    """Unpack a fixed prefix; return its values and the rest of the payload."""
    if len(payload) < layout.size:
        raise fail(msg_type, f"{len(payload)} bytes, need at least {layout.size}")
    return layout.unpack_from(payload), payload[layout.size:]


def dump_json(msg_type: MsgType, obj: dict) -> bytes:
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as err:
        raise fail(msg_type, f"not JSON-serialisable: {err}") from None


def load_json(msg_type: MsgType, data: bytes) -> dict:
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise fail(msg_type, f"invalid JSON: {err}") from None
    if not isinstance(obj, dict):
        raise fail(msg_type, f"JSON must be an object, got {type(obj).__name__}")
    return obj


def json_field(msg_type: MsgType, obj: dict, key: str, kind: type) -> Any:
    if key not in obj:
        raise fail(msg_type, f"JSON object lacks {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise fail(msg_type, f"{key!r} must be {kind.__name__}, got {value!r}")
    return value


def check_layout_fields(msg: Any) -> None:
    """Check that the first fields of ``msg`` fit the widths of its ``LAYOUT``."""
    codes = msg.LAYOUT.format.lstrip("!")
    for code, fld in zip(codes, fields(msg)):
        check_uint(msg.MSG_TYPE, fld.name, getattr(msg, fld.name), _BITS[code])
