"""Typed payloads of the PDD wire protocol: one frozen dataclass per message type.

Owns the byte layout of every payload and the map from ``MsgType`` to its
class. The wire enums (``MsgType``, ``Role``, ``ErrorCode``, ``FinishReason``)
and field codecs are in ``fields.py``; framing (header, checksums, streaming
decode) is in ``protocol.py``, which re-exports everything here.

Every message validates its fields when constructed, so a decoded message is
as valid as one built locally: ``decode`` and ``__init__`` raise
``ProtocolError`` naming the message and the bad field. Layouts (network byte
order, unsigned integers; ranges are half-open ``[start, end)``)::

  HELLO        JSON {"role": Role name, "name": str, "info": object}
  REQUEST      !II max_output_tokens, n_prompt | n_prompt x u32 ids | JSON metadata object
  KV_CHUNK     !HHII layer_start, layer_end, token_start, token_end | raw KV bytes
               (+ ``filler`` zero bytes after the payload, in the frame: protocol.py)
  KV_DONE      !IQI num_tokens, kv_bytes, num_chunks
  TOKENS       !BI producer (Role), start_position | u32 ids (>= 1)
  HANDOFF      !IIB batch, start_position, final (0/1) | u32 ids (may be empty)
  HANDOFF_ACK  !II batch, next_position
  KV_READY     !I num_tokens (MD holds KV for positions [0, num_tokens))
  DONE         !IB num_output_tokens, finish_reason
  ERROR        JSON {"code": ErrorCode value, "reason": str}
  HEALTH       !Q nonce
  HEALTH_ACK   !QII nonce, active_requests, waiting_requests
  CANCEL       empty
  KV_NEED      !II start, num_tokens (MD lacks prompt KV [start, num_tokens))
  REPORT       JSON {"role": Role name, "name": str, "data": object}
  STARTED      !I hit_tokens (P -> router: the request's prefill starts now)
  BIND         JSON metadata object (router -> P: the pipeline and decoders of a
               request P holds unbound: {"pipeline", "rld", "md"})

Token positions of TOKENS and HANDOFF are contiguous: ids[i] sits at
``start_position + i``.

KV_CHUNK is the one ``BULK`` message: its data may be megabytes, so it is
neither copied when built (bytes, bytearray or a memoryview are kept as
they are: do not modify them afterwards) nor when decoded (the data is a
read-only view of the frame's payload buffer), and it may carry ``filler``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, fields
from typing import ClassVar

from testbed.pdd.wire import fields as wire
from testbed.pdd.wire.fields import TOKEN_PRODUCERS, ErrorCode, FinishReason, MsgType, Role


class Message:
    """Base of all payloads: ``encode() -> bytes`` and ``decode(bytes) -> message``."""

    MSG_TYPE: ClassVar[MsgType]
    BULK: ClassVar[bool] = False  # large data: zero-copy encode/decode, may carry filler
    filler = 0  # zero bytes sent after the payload in the frame (KvChunk sets it)

    def encode(self) -> bytes:
        raise NotImplementedError

    def encode_parts(self) -> tuple[bytes | bytearray | memoryview, ...]:
        """The payload as buffers to send in order (their join is ``encode()``)."""
        return (self.encode(),)

    def payload_size(self) -> int:
        return len(self.encode())

    @classmethod
    def decode(cls, payload: bytes) -> Message:
        raise NotImplementedError


class _Fixed(Message):
    """A message whose payload is exactly ``LAYOUT``, fields in declaration order."""

    LAYOUT: ClassVar[struct.Struct]

    def __post_init__(self) -> None:
        wire.check_layout_fields(self)

    def encode(self) -> bytes:
        return self.LAYOUT.pack(*(getattr(self, f.name) for f in fields(self)))

    @classmethod
    def decode(cls, payload: bytes) -> Message:
        if len(payload) != cls.LAYOUT.size:
            raise wire.fail(cls.MSG_TYPE, f"{len(payload)} bytes, expected {cls.LAYOUT.size}")
        return cls(*cls.LAYOUT.unpack(payload))


@dataclass(frozen=True)
class Hello(Message):
    """First frame on a connection: who is speaking. ``Hello(Role.PREFILL, "p0")``."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.HELLO
    role: Role
    name: str
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", wire.as_enum(self.MSG_TYPE, "role", Role, self.role))
        if not isinstance(self.name, str) or not self.name:
            raise wire.fail(self.MSG_TYPE, f"name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.info, dict):
            raise wire.fail(self.MSG_TYPE, f"info must be a dict, got {self.info!r}")

    def encode(self) -> bytes:
        obj = {"role": self.role.name, "name": self.name, "info": self.info}
        return wire.dump_json(self.MSG_TYPE, obj)

    @classmethod
    def decode(cls, payload: bytes) -> Hello:
        obj = wire.load_json(cls.MSG_TYPE, payload)
        role = wire.json_field(cls.MSG_TYPE, obj, "role", str)
        if role not in Role.__members__:
            raise wire.fail(cls.MSG_TYPE, f"unknown role {role!r}")
        info = wire.json_field(cls.MSG_TYPE, obj, "info", dict)
        return cls(Role[role], wire.json_field(cls.MSG_TYPE, obj, "name", str), info)


@dataclass(frozen=True)
class Request(Message):
    """A prompt to serve.

    Example: ``Request((1, 2, 3), max_output_tokens=16, metadata={"session": "s1"})``.
    """

    MSG_TYPE: ClassVar[MsgType] = MsgType.REQUEST
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!II")
    prompt_token_ids: tuple[int, ...]
    max_output_tokens: int
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise wire.fail(self.MSG_TYPE, "prompt_token_ids is empty")
        wire.pack_u32s(self.MSG_TYPE, self.prompt_token_ids)
        wire.check_uint(self.MSG_TYPE, "max_output_tokens", self.max_output_tokens, 32)
        if self.max_output_tokens == 0:
            raise wire.fail(self.MSG_TYPE, "max_output_tokens must be >= 1")
        if not isinstance(self.metadata, dict):
            raise wire.fail(self.MSG_TYPE, f"metadata must be a dict, got {self.metadata!r}")

    def encode(self) -> bytes:
        head = self.LAYOUT.pack(self.max_output_tokens, len(self.prompt_token_ids))
        ids = wire.pack_u32s(self.MSG_TYPE, self.prompt_token_ids)
        return head + ids + wire.dump_json(self.MSG_TYPE, self.metadata)

    @classmethod
    def decode(cls, payload: bytes) -> Request:
        (max_out, n_prompt), rest = wire.split(cls.MSG_TYPE, cls.LAYOUT, payload)
        if len(rest) < 4 * n_prompt:
            raise wire.fail(cls.MSG_TYPE,
                            f"{n_prompt} prompt ids announced, {len(rest)} bytes left")
        ids = wire.unpack_u32s(cls.MSG_TYPE, rest[: 4 * n_prompt])
        return cls(ids, max_out, wire.load_json(cls.MSG_TYPE, rest[4 * n_prompt:]))


@dataclass(frozen=True)
class KvChunk(Message):
    """KV bytes of layers [layer_start, layer_end) x tokens [token_start, token_end),
    then ``filler`` zero bytes on the wire (padding to the modeled size, not part of
    the payload: see protocol.py).

    ``data`` is kept as given (bytes, bytearray or memoryview; not copied).
    Example: ``KvChunk(0, 4, 0, 64, kv_bytes, filler=3_000_000)``.
    """

    MSG_TYPE: ClassVar[MsgType] = MsgType.KV_CHUNK
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!HHII")
    BULK: ClassVar[bool] = True
    layer_start: int
    layer_end: int
    token_start: int
    token_end: int
    data: bytes | bytearray | memoryview
    filler: int = 0

    def __post_init__(self) -> None:
        wire.check_layout_fields(self)
        if self.layer_start >= self.layer_end or self.token_start >= self.token_end:
            raise wire.fail(self.MSG_TYPE, f"empty range: layers [{self.layer_start}, "
                        f"{self.layer_end}), tokens [{self.token_start}, {self.token_end})")
        wire.check_uint(self.MSG_TYPE, "filler", self.filler, 32)
        data = self.data
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise wire.fail(self.MSG_TYPE, f"data must be bytes, got {type(data).__name__}")
        if isinstance(data, memoryview) and (data.format != "B" or not data.c_contiguous):
            data = data.cast("B") if data.c_contiguous else data.tobytes()
            object.__setattr__(self, "data", data)

    def encode(self) -> bytes:
        return b"".join(self.encode_parts())

    def encode_parts(self) -> tuple[bytes | bytearray | memoryview, ...]:
        head = self.LAYOUT.pack(self.layer_start, self.layer_end, self.token_start, self.token_end)
        return (head, self.data) if len(self.data) else (head,)

    def payload_size(self) -> int:
        return self.LAYOUT.size + len(self.data)

    @classmethod
    def decode(cls, payload: bytes | bytearray | memoryview, filler: int = 0) -> KvChunk:
        view = memoryview(payload).toreadonly()
        values, data = wire.split(cls.MSG_TYPE, cls.LAYOUT, view)
        return cls(*values, data, filler)


@dataclass(frozen=True)
class KvDone(_Fixed):
    """End of a request's KV stream: lets the receiver check it has everything."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.KV_DONE
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!IQI")
    num_tokens: int
    kv_bytes: int
    num_chunks: int


@dataclass(frozen=True)
class Tokens(Message):
    """Generated ids at positions start_position.. by ``producer``.

    Example: ``Tokens(Role.RELAY_DECODE, start_position=0, token_ids=(17, 4))``.
    """

    MSG_TYPE: ClassVar[MsgType] = MsgType.TOKENS
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!BI")
    producer: Role
    start_position: int
    token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        producer = wire.as_enum(self.MSG_TYPE, "producer", Role, self.producer)
        if producer not in TOKEN_PRODUCERS:
            raise wire.fail(self.MSG_TYPE, f"{producer.name} does not produce tokens")
        object.__setattr__(self, "producer", producer)
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        if not self.token_ids:
            raise wire.fail(self.MSG_TYPE, "token_ids is empty")
        # the ids' wire bytes, kept for encode (the check packs them anyway)
        object.__setattr__(self, "_ids", _check_positions(self.MSG_TYPE, self.start_position,
                                                          self.token_ids))

    def encode(self) -> bytes:
        return self.LAYOUT.pack(self.producer, self.start_position) + self._ids

    def at(self, start_position: int) -> Tokens:
        """The same tokens at another position (the router's offset after a re-serve),
        without packing the ids again: ``Tokens(p, 0, ids).at(4) == Tokens(p, 4, ids)``."""
        if start_position == self.start_position:
            return self
        _check_range(self.MSG_TYPE, start_position, len(self.token_ids))
        return Tokens._trusted(self.producer, start_position, self.token_ids, self._ids)

    @classmethod
    def decode(cls, payload: bytes) -> Tokens:
        (producer, start), rest = wire.split(cls.MSG_TYPE, cls.LAYOUT, payload)
        role = _PRODUCER_BY_VALUE.get(producer)
        if role is None:  # not a role, or a role that produces no tokens: say which
            wire.as_enum(cls.MSG_TYPE, "producer", Role, producer)
            raise wire.fail(cls.MSG_TYPE, f"{Role(producer).name} does not produce tokens")
        ids = wire.unpack_u32s(cls.MSG_TYPE, rest)
        if not ids:
            raise wire.fail(cls.MSG_TYPE, "token_ids is empty")
        _check_range(cls.MSG_TYPE, start, len(ids))
        return cls._trusted(role, start, ids, bytes(rest))

    @classmethod
    def _trusted(cls, producer: Role, start: int, ids: tuple[int, ...], packed: bytes) -> Tokens:
        """A Tokens of fields already checked (``decode``, ``at``): no second packing."""
        msg = object.__new__(cls)
        object.__setattr__(msg, "producer", producer)
        object.__setattr__(msg, "start_position", start)
        object.__setattr__(msg, "token_ids", ids)
        object.__setattr__(msg, "_ids", packed)
        return msg


_PRODUCER_BY_VALUE = {int(r): r for r in TOKEN_PRODUCERS}


def _check_range(msg_type: MsgType, start: int, n: int) -> None:
    wire.check_uint(msg_type, "start_position", start, 32)
    if start + n > 0xFFFFFFFF:
        raise wire.fail(msg_type, f"positions [{start}, {start + n}) overflow u32")


def _check_positions(msg_type: MsgType, start: int, ids: tuple[int, ...]) -> bytes:
    """Check the positions and ids; return the ids' wire bytes."""
    _check_range(msg_type, start, len(ids))
    return wire.pack_u32s(msg_type, ids)


@dataclass(frozen=True)
class Handoff(Message):
    """RLD -> MD: token ids of positions [start_position, end_position), no KV.

    Example: ``Handoff(batch=0, start_position=1, token_ids=(5, 9), final=False)``.
    """

    MSG_TYPE: ClassVar[MsgType] = MsgType.HANDOFF
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!IIB")
    batch: int
    start_position: int
    token_ids: tuple[int, ...]
    final: bool

    def __post_init__(self) -> None:
        wire.check_uint(self.MSG_TYPE, "batch", self.batch, 32)
        if not isinstance(self.final, bool):
            raise wire.fail(self.MSG_TYPE, f"final must be a bool, got {self.final!r}")
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        _check_positions(self.MSG_TYPE, self.start_position, self.token_ids)

    @property
    def end_position(self) -> int:
        return self.start_position + len(self.token_ids)

    def encode(self) -> bytes:
        head = self.LAYOUT.pack(self.batch, self.start_position, int(self.final))
        return head + wire.pack_u32s(self.MSG_TYPE, self.token_ids)

    @classmethod
    def decode(cls, payload: bytes) -> Handoff:
        (batch, start, final), rest = wire.split(cls.MSG_TYPE, cls.LAYOUT, payload)
        if final not in (0, 1):
            raise wire.fail(cls.MSG_TYPE, f"final flag must be 0 or 1, got {final}")
        return cls(batch, start, wire.unpack_u32s(cls.MSG_TYPE, rest), bool(final))


@dataclass(frozen=True)
class HandoffAck(_Fixed):
    """MD -> RLD: batch applied; MD's next position to decode is next_position."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.HANDOFF_ACK
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!II")
    batch: int
    next_position: int


@dataclass(frozen=True)
class KvReady(_Fixed):
    """MD -> RLD: MD holds the KV of positions [0, num_tokens)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.KV_READY
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!I")
    num_tokens: int


@dataclass(frozen=True)
class Done(_Fixed):
    """The request is finished.

    Example: ``Done(num_output_tokens=16, finish_reason=FinishReason.LENGTH)``.
    """

    MSG_TYPE: ClassVar[MsgType] = MsgType.DONE
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!IB")
    num_output_tokens: int
    finish_reason: FinishReason

    def __post_init__(self) -> None:
        super().__post_init__()
        reason = wire.as_enum(self.MSG_TYPE, "finish_reason", FinishReason, self.finish_reason)
        object.__setattr__(self, "finish_reason", reason)


@dataclass(frozen=True)
class Error(Message):
    """The peer failed a request (header request id) or the connection (id 0)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.ERROR
    code: ErrorCode
    reason: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "code", wire.as_enum(self.MSG_TYPE, "code", ErrorCode, self.code))
        if not isinstance(self.reason, str):
            raise wire.fail(self.MSG_TYPE, f"reason must be a str, got {self.reason!r}")

    def encode(self) -> bytes:
        return wire.dump_json(self.MSG_TYPE, {"code": int(self.code), "reason": self.reason})

    @classmethod
    def decode(cls, payload: bytes) -> Error:
        obj = wire.load_json(cls.MSG_TYPE, payload)
        code = wire.json_field(cls.MSG_TYPE, obj, "code", int)
        return cls(code, wire.json_field(cls.MSG_TYPE, obj, "reason", str))


@dataclass(frozen=True)
class Health(_Fixed):
    """Liveness probe; the peer answers HEALTH_ACK with the same nonce."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.HEALTH
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!Q")
    nonce: int


@dataclass(frozen=True)
class HealthAck(_Fixed):
    """Answer to HEALTH, with the sender's live load (the router reads it)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.HEALTH_ACK
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!QII")
    nonce: int
    active_requests: int
    waiting_requests: int


@dataclass(frozen=True)
class Cancel(Message):
    """Abandon the request named by the frame header's request id. Empty payload."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.CANCEL

    def encode(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, payload: bytes) -> Cancel:
        if payload:
            raise wire.fail(cls.MSG_TYPE, f"{len(payload)} bytes, expected none")
        return cls()


@dataclass(frozen=True)
class KvNeed(_Fixed):
    """MD -> P: MD's DRC lacks the prompt's KV [start, num_tokens); send only that."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.KV_NEED
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!II")
    start: int
    num_tokens: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.start > self.num_tokens:
            raise wire.fail(self.MSG_TYPE, f"start {self.start} > num_tokens {self.num_tokens}")


@dataclass(frozen=True)
class Report(Message):
    """A role's per-request measurements (bytes per path, hit rates, handoff batches...).

    Example: ``Report(Role.MAIN_DECODE, "md0", {"md_hit_rate": 0.9, "kv_wan_bytes": 4096})``.
    """

    MSG_TYPE: ClassVar[MsgType] = MsgType.REPORT
    role: Role
    name: str
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "role", wire.as_enum(self.MSG_TYPE, "role", Role, self.role))
        if not isinstance(self.name, str) or not self.name:
            raise wire.fail(self.MSG_TYPE, f"name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.data, dict):
            raise wire.fail(self.MSG_TYPE, f"data must be a dict, got {self.data!r}")

    def encode(self) -> bytes:
        obj = {"role": self.role.name, "name": self.name, "data": self.data}
        return wire.dump_json(self.MSG_TYPE, obj)

    @classmethod
    def decode(cls, payload: bytes) -> Report:
        obj = wire.load_json(cls.MSG_TYPE, payload)
        role = wire.json_field(cls.MSG_TYPE, obj, "role", str)
        if role not in Role.__members__:
            raise wire.fail(cls.MSG_TYPE, f"unknown role {role!r}")
        data = wire.json_field(cls.MSG_TYPE, obj, "data", dict)
        return cls(Role[role], wire.json_field(cls.MSG_TYPE, obj, "name", str), data)


@dataclass(frozen=True)
class Started(_Fixed):
    """P -> router: the prefill of a request P holds unbound starts now; P's prefix
    cache holds ``hit_tokens`` of its prompt. The router binds the request then (BIND)."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.STARTED
    LAYOUT: ClassVar[struct.Struct] = struct.Struct("!I")
    hit_tokens: int


@dataclass(frozen=True)
class Bind(Message):
    """Router -> P: the pipeline and decoders of a request P holds unbound (its REQUEST's
    metadata ``bind`` was ``"late"``), merged into the REQUEST's metadata.

    Example: ``Bind({"pipeline": "p-rld-md", "rld": "rld1", "md": "md2"})``."""

    MSG_TYPE: ClassVar[MsgType] = MsgType.BIND
    metadata: dict

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, dict):
            raise wire.fail(self.MSG_TYPE, f"metadata must be a dict, got {self.metadata!r}")
        if not isinstance(self.metadata.get("pipeline"), str):
            raise wire.fail(self.MSG_TYPE, "metadata.pipeline must be a str, got "
                                           f"{self.metadata.get('pipeline')!r}")

    def encode(self) -> bytes:
        return wire.dump_json(self.MSG_TYPE, self.metadata)

    @classmethod
    def decode(cls, payload: bytes) -> Bind:
        return cls(wire.load_json(cls.MSG_TYPE, payload))


MESSAGE_CLASSES: dict[MsgType, type[Message]] = {
    cls.MSG_TYPE: cls
    for cls in (Hello, Request, KvChunk, KvDone, Tokens, Handoff, HandoffAck,
                KvReady, Done, Error, Health, HealthAck, Cancel, KvNeed, Report, Started, Bind)
}
assert set(MESSAGE_CLASSES) == set(MsgType), "every MsgType needs a payload class"


def decode_payload(msg_type: MsgType, payload: bytes | bytearray | memoryview,
                   filler: int = 0) -> Message:
    """Decode ``payload`` as a ``msg_type`` message; ProtocolError if it is not one.

    ``filler``: the frame's filler length (only a BULK message may have any).
    A BULK message's data is a view of ``payload``, not a copy.

    >>> decode_payload(MsgType.KV_READY, b"\\x00\\x00\\x00\\x07")
    KvReady(num_tokens=7)
    """
    cls = MESSAGE_CLASSES.get(msg_type) or MESSAGE_CLASSES[MsgType(msg_type)]
    if cls.BULK:
        return cls.decode(payload, filler)
    if filler:
        raise wire.fail(cls.MSG_TYPE, f"{filler} filler bytes; only KV_CHUNK carries filler")
    return cls.decode(bytes(payload))


def fixed_payload_size(cls: type[Message]) -> int | None:
    """The exact payload size of a fixed-layout message class (CANCEL: 0), else None.

    >>> fixed_payload_size(KvDone), fixed_payload_size(Request)
    (16, None)
    """
    if issubclass(cls, _Fixed):
        return cls.LAYOUT.size
    return 0 if cls is Cancel else None
