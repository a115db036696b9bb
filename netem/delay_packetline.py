"""The packet-line delay mode: ``netem.packetline``, a userspace delay line that replaces the
bridge in the switch namespace, for kernels without netem and inside a user namespace.
"""
from __future__ import annotations

from typing import Any

from netem.delay import DelayMode


class PacketLineDelay(DelayMode):
    """``netem.packetline``: a userspace delay line that replaces the bridge in the switch
    namespace (raw packet sockets), for kernels without netem and inside a user namespace."""

    name = "packet-line"
    needs = ("packet",)
    where = "a userspace packet delay line between the namespaces (raw packet sockets)"

    def replaces_bridge(self, plan: Any, delayed_later: bool) -> bool:
        """Only where a link has something for the line to do now (``plan.impaired``) or will
        have: a rate alone is tc's, and the bridge forwards faster than the line."""
        return bool(plan.shaped and (plan.impaired or delayed_later))

    def change_link(self, session: Any, live: Any, src: int, dst: int, rate_mbit: float,
                    latency_ms: float | None) -> list:
        if session.runs_line and latency_ms is not None:
            session.set_line_latency(src, dst, latency_ms)
        return live.change(src, dst, rate_mbit=rate_mbit)

    def latency_refusal(self, live: Any, src: int, dst: int) -> str | None:
        return ("is not in a qdisc: the packet line holds this run's latency; change it with "
                "NetworkSession.set_line_latency")
