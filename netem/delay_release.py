"""The release-queue delay mode: each receiving worker holds a message until its arrival plus
the link's latency (``netem.userspace``). Not faithful to TCP: the senders' kernels never
see the delay.
"""
from __future__ import annotations

from typing import Any

from netem.delay import DelayMode
from netem.userspace import build_spec


class ReleaseQueueDelay(DelayMode):
    """The receiving worker holds each message until arrival + latency
    (``netem.userspace``). Not faithful to TCP: its kernel never sees the delay."""

    name = "release-queue"
    faithful_to_tcp = False
    applies = frozenset({"latency_ms"})
    where = ("the receiver's release queue: messages are held after TCP delivered them, so "
             "TCP never sees the delay (not faithful to TCP)")
    on_packets = False
    across_hosts = True

    def worker_spec(self, plan: Any) -> dict | None:
        if not plan.max_of("latency_ms"):
            return None
        return build_spec(plan, "delay-only")

    def latency_refusal(self, live: Any, src: int, dst: int) -> str | None:
        why = live.decision.caps.errors.get("netem", "") if live.decision.caps else ""
        return (f"needs the netem qdisc, which this run's tc shaper does not have (delay "
                f"{self.name!r}{': ' + why if why else ''}); latency is then the receiver's "
                f"release queue: change it on worker {dst} with "
                f"LinkShaper.set_rx_link({src}, ...)")
