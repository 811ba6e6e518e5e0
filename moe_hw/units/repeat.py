"""The repeat unit's hardware is the expand unit's (SPEC 1.6, seed 002): OneFlow ``repeat`` is
reshape + expand + reshape, and the reshapes cost nothing on a flat stream, so the host
(:mod:`moe_hw.host.repeat`) plans the expand and runs it on :class:`ExpandUnit`, the very same
Verilog. This module only names it for ``repeat``."""

from .expand import ExpandParams as RepeatParams, ExpandUnit as RepeatUnit

__all__ = ["RepeatParams", "RepeatUnit"]
