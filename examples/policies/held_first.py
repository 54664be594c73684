"""A user placement: the MD holding most of the prompt, however little, then the least loaded.

This is the rank the router placed by before it weighed costs (docs/policies.md,
"Placement"): any held prefix beats any load difference. On a trace whose prompts
share one opening block (the Mooncake slice: one 512-token block, 16 tokens at
input_len_divisor 32) the first MD to hold that block takes every request. Kept as a
placement to compare against, and as an example of ``place``: the pipeline is PDD's
own rule (``decide`` inherits it).

    modes:
      - pdd
      - {name: pdd-held-first, policy: ../examples/policies/held_first.py:HeldFirst}
"""

from testbed.pdd.policy import Placement
from testbed.pdd.policy.pdd import PddRule


class HeldFirst(PddRule):
    name = "held-first"

    def place(self, c):
        p = min(c.p, default=None, key=lambda x: (round(x.prefill_end_s, 6), -x.hit_tokens,
                                                  x.name))
        md = min(c.md, default=None, key=lambda x: (-x.held_tokens, x.active, x.name))
        rld = min(c.rld, default=None, key=lambda x: (x.active, x.name))
        return Placement(p and p.name, rld and rld.name, md and md.name)
