"""The userspace shaper: each worker paces what it sends and releases what it receives
(``netem.userspace.LinkShaper``), from a spec the launcher ships. No privileges, no
namespaces: every worker in the launcher's. Only the receivers' release queue delays, so the
senders' TCP never sees the latency; jitter and loss are refused (they need packets). The
workers apply a scenario's link changes at their round starts.
"""
from __future__ import annotations

from typing import Any

from netem.capabilities import Decision, fixed_delay_decision
from netem.shapers import Shaper


class UserspaceShaper(Shaper):
    name = "userspace"
    delay_modes = ("release-queue",)
    where = "sender pacing + receiver release queue"
    changes_applied_by = "userspace: each worker at its round start"

    def decide(self, caps: Any, delay: str, why: str, auto: bool) -> Decision:
        if auto:
            why += f"; using the {self.name} shaper"
        return fixed_delay_decision(self, caps, delay, why)

    def decide_across_hosts(self, link_plan: Any, why: str, auto: bool) -> Decision:
        from netem.commands import check_supported
        decision = fixed_delay_decision(self, None, "auto", why)
        check_supported(link_plan, decision)  # jitter and loss need netem: refused up front
        return decision

    def check_plan(self, plan: Any, decision: Decision) -> None:
        from netem.commands import check_default_queues
        check_default_queues(plan, decision)

    def worker_spec(self, plan: Any, decision: Decision) -> dict | None:
        from netem.userspace import build_spec
        return build_spec(plan, "userspace")
