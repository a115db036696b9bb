"""The tc shaper: HTB classes per directed link in the kernel.

On one host each worker lives in a network namespace of its own on a bridge, built and removed
by ``netem.namespaces`` from the commands of ``netem.commands``; a scenario's link changes are
tc changes in place (``netem.live``), applied by the launcher. Across hosts the classes go on
each host's interfaces, matched on the destination address and port (``netem.hosttc``), so each
worker binds one port per sender. It carries every delay mode of ``netem.delay``: the kernel's
netem, the packet line, or the receivers' release queue (the only one across hosts).
"""
from __future__ import annotations

from typing import Any

from netem import delay as delay_modes
from netem.capabilities import CapabilityError, Decision
from netem.shapers import HostPart, Shaper


class TcShaper(Shaper):
    name = "tc"
    delay_modes = ("netem", "packet-line", "release-queue")
    worker_namespaces = True
    where = "HTB classes per directed link in the kernel"
    changes_applied_by = "tc: the launcher, when the first worker reports the round before"

    def decide(self, caps: Any, delay: str, why: str, auto: bool) -> Decision:
        why = {"auto: tc is possible": "auto: network namespaces and htb work"}.get(why, why)
        try:
            m, how = delay_modes.choose(delay, caps)
        except delay_modes.DelayModeError as exc:
            raise CapabilityError(str(exc)) from None
        return Decision(self.name, m.name, f"{why}; {how}", caps)

    def decide_across_hosts(self, link_plan: Any, why: str, auto: bool) -> Decision:
        from netem.hosttc import check_host_plan
        check_host_plan(link_plan)
        return Decision(self.name, "release-queue", f"{'auto: ' if auto else ''}"
                        "tc on every host's interfaces (HTB per directed link, matched on "
                        "destination address and port); latency by the receiver's release queue")

    def check_plan(self, plan: Any, decision: Decision) -> None:
        from netem.commands import check_down_caps
        check_down_caps(plan, decision.caps)

    def before_launch(self, argv: list[str]) -> None:
        """Re-execute the launcher in its own user + network + mount namespace: everything the
        run builds lives there and vanishes with the launcher, even on kill -9."""
        from netem.namespaces import reexec_in_userns
        reexec_in_userns(argv)  # returns only when already inside, or userns is unavailable

    def link_changer(self, session: Any) -> TcLinkChanger:
        return TcLinkChanger(session)

    def on_host(self, plan: Any, local: list[int], bases: dict[int, tuple[str, int]],
                mtu: int) -> HostPart:
        from netem.hosttc import HostShaping, host_links, route_dev
        from netem.namespaces import new_run_id
        return HostClasses(HostShaping(new_run_id(), host_links(plan, local, bases, route_dev),
                                       mtu))

    def worker_spec(self, plan: Any, decision: Decision) -> dict | None:
        """The workers hold the latency when the delay mode is the receivers' release queue;
        tc shapes the rates."""
        return decision.delay_mode.worker_spec(plan)


class TcLinkChanger:
    """A round's link changes {(src, dst): (rate_mbit, latency_ms)} on a running tc network:
    rates with tc, in place (``netem.live.LiveLinks``, made at the first change); latencies
    where the run's delay mode holds them (``DelayMode.change_link``): netem's qdiscs, the
    packet line, or the receivers' release queues (the workers apply those)."""

    def __init__(self, session: Any):
        self.session = session
        self._live = None

    def __call__(self, changes: dict) -> None:
        from netem.live import LiveLinks
        from netem.namespaces import run_commands
        s = self.session
        if self._live is None:
            self._live = LiveLinks(s.plan, s.topo, s.decision, gso_floor_mbit=s.gso_floor_mbit)
        mode, cmds = s.decision.delay_mode, []
        for (src, dst), (rate, latency) in sorted(changes.items()):
            rate = rate if rate is not None else self._live.rate_mbit(src, dst)
            cmds += mode.change_link(s, self._live, src, dst, rate, latency)
        run_commands(cmds)


class HostClasses(HostPart):
    """tc classes on this host's interfaces (``netem.hosttc.HostShaping``): one port per
    sender, removed on close."""

    ports_per_sender = True

    def __init__(self, tc: Any):
        self.tc = tc

    def start(self) -> None:
        self.tc.start()

    def close(self) -> None:
        self.tc.close()

    def describe(self) -> dict | None:
        return self.tc.describe()

    def change_links(self, changes: dict) -> None:
        """Host tc classes are not changed by scenarios yet, so tc is not taken for such a
        scenario (``gasloc_emu.netplan.multi_host_decision``), and a change that comes anyway
        is an error, never skipped."""
        if changes:
            raise RuntimeError("a scenario's link changes on a multi-node tc network are not "
                               "applied yet; use net.shaper = 'userspace'")
