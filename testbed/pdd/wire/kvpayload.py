"""KV_CHUNK frames of modeled size: the tiny model's real KV bytes plus filler.

Owns how a token range of a KV cache (either engine's: ``KVCache``, ``HashCache``)
becomes a ``KvChunk`` and back::

    payload: !HHII ranges | real KV bytes (cache.to_bytes)      CRC-checked
    filler:  zero bytes up to the modeled size                  zero-checked

``data + filler`` is ``modeled_bytes`` long (``tokens * kv_bytes_per_token /
k``, see ``TimingConfig.modeled_kv_bytes``) so the network carries what the
modeled big model would, scaled by k. The filler is frame-level
(``protocol.py``): sent from a shared zero buffer, checked and dropped by the
receiver without being buffered, so it costs no Python work per byte. If the
real bytes exceed the modeled size they are sent without filler and the
excess is returned as an overrun, which P reports.

Example::

    chunk, overrun = kv_chunk(cache, 0, 64, modeled_bytes=320_000)
    seg = decode_kv(chunk.data)     # KVCache segment of positions [0, 64)
    seg = decode_kv(chunk.data, "hash")  # on the hash engine: a HashCache
"""

from __future__ import annotations

from testbed.pdd.compute.engine import Cache, kv_from_bytes
from testbed.pdd.wire.protocol import KvChunk, frame_size


def chunk_frame_bytes(chunk: KvChunk) -> int:
    """Wire bytes of a KV_CHUNK frame (header + fixed fields + data + filler), without
    re-encoding."""
    return frame_size(chunk)


def encode_kv(cache: Cache, start: int, end: int,
              modeled_bytes: int) -> tuple[bytearray, int, int]:
    """Positions [start, end) of ``cache``: (real KV bytes, filler bytes, overrun bytes)."""
    real = cache.to_bytes(start, end)
    return real, max(0, modeled_bytes - len(real)), max(0, len(real) - modeled_bytes)


def kv_chunk(cache: Cache, start: int, end: int, modeled_bytes: int) -> tuple[KvChunk, int]:
    """The KV_CHUNK of positions [start, end), all layers, modeled size; and the overrun."""
    real, filler, overrun = encode_kv(cache, start, end, modeled_bytes)
    return KvChunk(0, cache.n_layer, start, end, real, filler), overrun


def decode_kv(data: bytes | bytearray | memoryview, engine: str = "torch") -> Cache:
    """The KV segment in a KV_CHUNK's data (``cache.to_bytes``) of the receiver's engine;
    ProtocolError if malformed or another engine's."""
    return kv_from_bytes(data, engine)
