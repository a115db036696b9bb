"""The netem delay mode: the kernel's netem qdisc on the switch port towards each receiver
(``netem.commands.delay_commands``), changed in place during a run (``netem.live``).
"""
from __future__ import annotations

from typing import Any

from netem.commands import delay_commands, delay_layout, peers_of
from netem.delay import DelayMode


class NetemDelay(DelayMode):
    """The kernel's netem qdisc on the switch port towards each receiver: one qdisc where all
    of its senders look alike, else one per sender under an HTB tree."""

    name = "netem"
    needs = ("netem",)
    where = "the kernel's netem qdisc on the switch port towards each receiver"

    def port_commands(self, plan: Any, topo: Any, rank: int, per_sender: bool) -> list:
        return delay_commands(plan, topo, rank, per_sender)

    def change_link(self, session: Any, live: Any, src: int, dst: int, rate_mbit: float,
                    latency_ms: float | None) -> list:
        return live.change(src, dst, rate_mbit=rate_mbit, latency_ms=latency_ms)

    def port_delay_change(self, live: Any, src: int, dst: int) -> Any:
        return live.netem_command(src, dst)

    def latency_refusal(self, live: Any, src: int, dst: int) -> str | None:
        layout = delay_layout(live.plan, dst, live.per_sender_delay)
        if layout == "none":
            what = f"the run was set up without delay towards worker {dst}"
        elif layout == "root" and len(peers_of(live.plan, dst)) > 1:
            what = f"its netem qdisc is shared by every sender to worker {dst}"
        else:
            return None
        return (f"cannot be changed in place: {what}; set the network up with "
                "per_sender_delay=True (one netem per sender)")
