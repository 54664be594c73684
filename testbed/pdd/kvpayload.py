"""KV_CHUNK payloads of modeled size: the tiny model's real KV bytes, padded.

Owns the byte layout inside a ``KvChunk.data``::

    !I real_len | real KV bytes (KVCache.to_bytes) | zero padding

The whole payload is ``modeled_bytes`` long (``tokens * kv_bytes_per_token / k``,
see ``TimingConfig.modeled_kv_bytes``) so the network carries what the
modeled big model would, scaled by k. If the real bytes (plus the 4-byte
length) exceed the modeled size they are sent unpadded and the excess is
returned as an overrun, which P reports.

Example::

    data, overrun = encode_kv(cache, 0, 64, modeled_bytes=320_000)
    seg = decode_kv(data)        # KVCache segment of positions [0, 64)
"""

from __future__ import annotations

import struct

from testbed.errors import ProtocolError
from testbed.pdd.model import KVCache
from testbed.pdd.protocol import HEADER_SIZE, KvChunk

_LEN = struct.Struct("!I")


def chunk_frame_bytes(chunk: KvChunk) -> int:
    """Wire bytes of a KV_CHUNK frame (header + fixed fields + payload), without re-encoding."""
    return HEADER_SIZE + KvChunk.LAYOUT.size + len(chunk.data)


def encode_kv(cache: KVCache, start: int, end: int, modeled_bytes: int) -> tuple[bytes, int]:
    """Positions [start, end) of ``cache`` as a payload; return (payload, overrun bytes)."""
    real = cache.to_bytes(start, end)
    used = _LEN.size + len(real)
    pad = max(0, modeled_bytes - used)
    return _LEN.pack(len(real)) + real + bytes(pad), max(0, used - modeled_bytes)


def decode_kv(data: bytes) -> KVCache:
    """The KV segment in a payload made by ``encode_kv``; ProtocolError if malformed."""
    if len(data) < _LEN.size:
        raise ProtocolError(f"KV payload of {len(data)} bytes has no length prefix")
    (real_len,) = _LEN.unpack_from(data)
    if _LEN.size + real_len > len(data):
        raise ProtocolError(f"KV payload says {real_len} real bytes, holds {len(data) - 4}")
    return KVCache.from_bytes(data[_LEN.size: _LEN.size + real_len])
