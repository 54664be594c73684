"""``loss``: the link loses packets: random ``pct``, or a ``loss:`` mapping
(``model: gilbert_elliott`` with p_pct, r_pct, bad_loss_pct, good_loss_pct)."""

from __future__ import annotations

from testbed.spec.faultkinds.base import Export, set_link_actions, wan_set
from testbed.impairment import LossSpec
from testbed.spec.link import parse_loss

NAME = "loss"
DOC = "pct | loss: {model: gilbert_elliott, ...}  [link] [duration_s]"


def parse(f, base, duration_s):
    if f.has("loss"):
        return {"loss": parse_loss(f.sub("loss"))}, duration_s
    return {"loss": LossSpec("random", pct=f.num("pct", lo=0, hi=100, unit="percent"))}, duration_s


def actions(fault, ops):
    return set_link_actions(fault, ops, loss=fault.params["loss"])


def export(fault, nominal, instances, horizon_s, notes):
    return Export(wan=wan_set(fault, nominal, {"loss_pct": exported_loss_pct(
        fault.params["loss"], notes, f"fault {fault.index} (loss)")}))


def exported_loss_pct(loss: LossSpec, notes: list[str], what: str) -> float:
    """NetworkChaos has only random loss (with a correlation): Gilbert-Elliott goes
    out at its mean, said in ``notes``."""
    if loss.model == "gilbert_elliott":
        notes.append(f"{what}: Gilbert-Elliott loss (p {loss.p_pct:g}%, r {loss.r_pct:g}%, "
                     f"bad {loss.bad_loss_pct:g}%, good {loss.good_loss_pct:g}%) exported as "
                     f"random loss at its mean, {loss.mean_pct:.3g}%: NetworkChaos has only "
                     "random loss with a correlation")
    return loss.mean_pct
