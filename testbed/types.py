"""One enum per concept shared across packages (vidur's ``types/``).

Mode: what the router may choose; Pipeline: the path of one request;
HandoffMode: how RLD hands over. The link Backend lives with the shaping
arithmetic (testbed.net.shaping); role names in topologies are
testbed.spec.topology.Role and on the wire testbed.pdd.wire.Role (an
integer encoding of the same roles).
"""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    """What the router may choose (docs/pdd-roles.md, Pipelines)."""

    PDD = "pdd"  # p-md or p-rld-md by expected WAN time; anomalous filter -> rld-only
    CROSS_DC_PD = "cross-dc-pd"  # baseline: every request p-md over the WAN
    SAME_DC_PD = "same-dc-pd"  # baseline: every request rld-only (RLD as a same-DC decoder)
    P_RLD = "p-rld"  # excluded design: low-hit requests rld-only, the rest p-md


class Pipeline(enum.Enum):
    P_MD = "p-md"
    P_RLD_MD = "p-rld-md"
    RLD_ONLY = "rld-only"


class HandoffMode(enum.Enum):
    ONE_SHOT = "one-shot"
    CATCH_UP = "catch-up"
