"""No shaper: nothing is shaped, no rate and no delay (``net.shaper = none``); every worker on
the launcher's loopback. A partition's cuts are the algorithms' absent edges.
"""
from __future__ import annotations

from typing import Any

from netem.capabilities import Decision, fixed_delay_decision
from netem.shapers import Shaper


class NoShaper(Shaper):
    name = "none"
    shapes = False
    delay_modes = ("none",)
    where = "nothing shaped"
    changes_applied_by = "none: a partition's cuts are the algorithms' absent edges"

    def decide(self, caps: Any, delay: str, why: str, auto: bool) -> Decision:
        return fixed_delay_decision(self, caps, delay, why)

    def decide_across_hosts(self, link_plan: Any, why: str, auto: bool) -> Decision:
        return fixed_delay_decision(self, None, "auto", why)
