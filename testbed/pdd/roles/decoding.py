"""What the two decoding roles (RLD, MD) share: the model and one decode loop.

Owns ``DecodingRoleServer``: a ``RoleServer`` that warms the configured
model and runs one ``DecodeLoop`` paced at its role's modeled step time
(``cfg.timing.cost(ROLE)``, scaled by ``time_scale``), started when the
server listens and stopped first when it stops. A subclass sets ``ROLE``
and implements ``_on_tokens`` (where the loop's emitted tokens go).
"""

from __future__ import annotations

from testbed.errors import ProtocolError
from testbed.pdd.compute.decoder import DecodeLoop, Emitted, warm_model
from testbed.pdd.compute.engine import Cache
from testbed.pdd.compute.pacing import AsyncPacer
from testbed.pdd.roles.peers import RoleServer
from testbed.pdd.run.config import ClusterConfig
from testbed.pdd.wire.kvpayload import chunk_frame_bytes, decode_kv
from testbed.pdd.wire.protocol import KvChunk
from testbed.pdd.wire.transport import Transport


class DecodingRoleServer(RoleServer):
    def __init__(self, cfg: ClusterConfig, name: str, transport: Transport,
                 chunk_tokens: int = 0):
        super().__init__(cfg, name, transport)
        self.model = warm_model(cfg.model)
        self.decoder = DecodeLoop(self.model, cfg.timing.cost(self.ROLE),
                                  AsyncPacer(cfg.timing.time_scale), self._on_tokens,
                                  chunk_tokens=chunk_tokens)

    async def _on_tokens(self, emitted: list[Emitted]) -> None:
        """Where the decode loop's tokens go (the subclass's)."""
        raise NotImplementedError

    def take_chunk(self, cache: Cache, msg: KvChunk) -> int:
        """Append a KV_CHUNK's KV to ``cache``; its frame's bytes. ProtocolError when the
        KV holds other positions than the chunk's header says."""
        seg = decode_kv(msg.data, self.cfg.model.engine)
        if (seg.start, seg.end) != (msg.token_start, msg.token_end):
            raise ProtocolError(f"KV_CHUNK [{msg.token_start}, {msg.token_end}) holds "
                                f"[{seg.start}, {seg.end})")
        cache.append(seg)
        return chunk_frame_bytes(msg)

    async def on_start(self) -> None:
        self.decoder.start()

    async def on_stop(self) -> None:
        await self.decoder.stop()
