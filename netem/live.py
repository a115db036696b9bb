"""Changing shaped links while a run goes on: `LiveLinks` knows the values in force and turns a
change of rate or latency into the few tc commands that apply it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from netem.capabilities import CapabilityError, Decision
from netem.commands import (
    CUT_LEAF_LIMIT_PKTS,
    LEAF_LIMIT_PKTS,
    Command,
    NetTopology,
    Tree,
    check_number,
    check_rate_mbit,
    cmd,
    delay_layout,
    egress_tree,
    gso_command,
    htb_rate_bps,
    ingress_tree,
    leaf_command,
    link_classes,
    link_classid,
    netem_args,
    peers_of,
    tree_cap_bps,
)
from netem.profiles import LATENCY_RANGE_MS, LinkPlan


class LiveLinks:
    """The directed links of a running tc network as they are now, and the commands that change
    them in place.

    Built from the LinkPlan the network was set up with, which fixes what exists (classes and
    their ids, caps, ifb trees, the netem layout; ``per_sender_delay`` as given to
    ``plan_commands``). ``change`` returns the commands for one directed link and remembers the
    new values, because later changes depend on them: a worker's ``gso_max_segs`` follows its
    slowest link in force, and a netem ``change`` restates the link's whole delay. Run what it
    returns, in order (``netem.namespaces.run_commands``); a failure leaves the network in an
    unknown state, which should end the run.

    A cut (rate 0) closes the link's leaf queues (``CUT_LEAF_LIMIT_PKTS``) and keeps its classes
    at the rate they had; every later rate change restates the leaves' limit, which reopens it.
    """

    def __init__(self, plan: LinkPlan, topo: NetTopology, decision: Decision, *,
                 per_sender_delay: bool = False,
                 gso_floor_mbit: Mapping[int, float] | None = None):
        self.gso_floor_mbit = dict(gso_floor_mbit or {})
        if topo.workers != plan.workers:
            raise ValueError(f"topology has {topo.workers} workers, the plan {plan.workers}")
        if not decision.shaper_kind.worker_namespaces:
            raise CapabilityError(f"links are changed with tc only under the tc shaper; this run "
                                  f"has shaper {decision.shaper!r} (the userspace shaper changes "
                                  "them with LinkShaper.set_link and set_rx_link)")
        if not plan.shaped:
            raise ValueError("this run was set up unshaped (no bandwidth profile): there are no "
                             "link classes to change")
        self.plan, self.topo, self.decision = plan, topo, decision
        self.per_sender_delay = per_sender_delay
        # the rate of each link's classes (a cut keeps it), and which links are cut
        self._rate_mbit = {key: link.rate_mbit for key, link in plan.links.items()}
        self._latency_ms = {key: link.latency_ms for key, link in plan.links.items()}
        self._cut: set[tuple[int, int]] = set()

    def rate_mbit(self, src: int, dst: int) -> float:
        """The goodput rate of src -> dst in force (0: cut)."""
        key = self._check_link(src, dst)
        return 0.0 if key in self._cut else self._rate_mbit[key]

    def latency_ms(self, src: int, dst: int) -> float:
        return self._latency_ms[self._check_link(src, dst)]

    def effective_rate_mbit(self, src: int, dst: int) -> float:
        """What one flow src -> dst can get now: min(link, src's uplink, dst's downlink); 0 when
        cut."""
        rate = self.rate_mbit(src, dst)
        caps = [self.plan.cap(src).up_mbit, self.plan.cap(dst).down_mbit]
        return 0.0 if rate == 0 else min([rate] + [c for c in caps if c is not None])

    def change(self, src: int, dst: int, *, rate_mbit: float | None = None,
               latency_ms: float | None = None) -> list[Command]:
        """The commands that give src -> dst this rate (goodput Mbit/s, 0 = cut) and/or latency
        (ms) from now on. Everything is checked before anything is remembered."""
        key = self._check_link(src, dst)
        if rate_mbit is None and latency_ms is None:
            raise ValueError(f"link {src}->{dst}: nothing to change; give rate_mbit or latency_ms")
        rate = None if rate_mbit is None else check_rate_mbit(f"link {src}->{dst} rate_mbit",
                                                              rate_mbit)
        latency = None if latency_ms is None else self._check_latency(src, dst, latency_ms)
        gso_before, netem_before = self._gso(src), self._netem(src, dst)
        if latency is not None:
            self._latency_ms[key] = latency
        out = [] if rate is None else self._set_rate(src, dst, rate)
        netem = self._netem(src, dst)
        if netem is not None and netem.argv != netem_before.argv:
            out.append(netem)
        return self._with_gso(out, gso_before, self._gso(src))

    # -- checks

    def _check_link(self, src: int, dst: int) -> tuple[int, int]:
        n = self.plan.workers
        for v in (src, dst):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                raise ValueError(f"worker {v!r} is out of range; this run has workers 0..{n - 1}")
        if src == dst:
            raise ValueError(f"link {src}->{dst}: src and dst are the same worker")
        return src, dst

    def _check_latency(self, src: int, dst: int, value: object) -> float:
        """The new latency, or a CapabilityError where no netem qdisc can take it in place."""
        v = check_number(f"link {src}->{dst} latency_ms", value, *LATENCY_RANGE_MS)
        if v == self._latency_ms[(src, dst)]:
            return v                                # nothing to change (e.g. a restore)
        why = self.decision.delay_mode.latency_refusal(self, src, dst)
        if why is not None:
            raise CapabilityError(f"latency_ms = {v:g} on link {src}->{dst} {why}")
        return v

    # -- commands

    def _set_rate(self, src: int, dst: int, rate: float) -> list[Command]:
        """Remember the rate; a cut closes the leaves, any other rate changes the classes and
        restates the leaves' limit (reopening them after a cut)."""
        if rate == 0:
            self._cut.add((src, dst))
            return self._leaf_changes(src, dst, CUT_LEAF_LIMIT_PKTS)
        self._cut.discard((src, dst))
        self._rate_mbit[(src, dst)] = rate
        return self._class_changes(src, dst) + self._leaf_changes(src, dst, LEAF_LIMIT_PKTS)

    def _leaf_changes(self, src: int, dst: int, limit_pkts: int) -> list[Command]:
        """``tc qdisc change`` of the ACK and bulk leaves of src's egress class for dst."""
        tree = egress_tree(self.plan, self.topo, src, self._rate_mbit)
        minor = link_classid(next(i for i, f in enumerate(tree.flows) if f.peer == dst))
        desc = f"link ->{dst} {'cut' if limit_pkts == CUT_LEAF_LIMIT_PKTS else 'open'}"
        return [leaf_command(tree, m, "change", limit_pkts, desc) for m in (minor + 1, minor + 2)]

    def _class_changes(self, src: int, dst: int) -> list[Command]:
        """``tc class change`` of every class that enforces src -> dst: src's egress class for
        dst and, where dst has a download cap, dst's ifb class for src; and the reverse link's
        classes, whose room for src -> dst's ACKs follows src -> dst's rate
        (netem.commands.ack_headroom_bps)."""
        out = _changed_flow(egress_tree(self.plan, self.topo, src, self._rate_mbit), dst)
        if self.plan.cap(dst).down_mbit is not None:
            out += _changed_flow(ingress_tree(self.plan, self.topo, dst, self._rate_mbit), src)
        back = egress_tree(self.plan, self.topo, dst, self._rate_mbit)
        if any(f.peer == src for f in back.flows):
            out += _changed_flow(back, src)
            if self.plan.cap(src).down_mbit is not None:
                out += _changed_flow(ingress_tree(self.plan, self.topo, src, self._rate_mbit),
                                     dst)
        return out

    def _gso(self, rank: int) -> Command | None:
        """Set-up's GSO rule over the links in force; cut links do not count (nothing that
        matters crosses them), and with every link cut there is nothing to size it by."""
        rates = (self.effective_rate_mbit(rank, j) for j in peers_of(self.plan, rank))
        live = [r for r in rates if r > 0]
        floor = self.gso_floor_mbit.get(rank, math.inf)
        return gso_command(self.topo, rank, min(live + [floor])) if live else None

    @staticmethod
    def _with_gso(out: list[Command], before: Command | None,
                  after: Command | None) -> list[Command]:
        """GSO shrinks before the classes slow down and grows after they sped up, so that no
        packet sized for one rate meets the other."""
        if after is None or (before is not None and after.argv == before.argv):
            return out
        shrinks = before is not None and int(after.argv[-1]) < int(before.argv[-1])
        return [after] + out if shrinks else out + [after]

    def _netem(self, src: int, dst: int) -> Command | None:
        """The delay mode's restated delay for src -> dst as the links are now (None: it puts
        none on the switch port)."""
        return self.decision.delay_mode.port_delay_change(self, src, dst)

    def netem_command(self, src: int, dst: int) -> Command | None:
        """netem's ``change`` for src -> dst as the links are now (None: no netem towards dst).

        netem's limit follows the rate, so a rate change alone may change it too."""
        layout = delay_layout(self.plan, dst, self.per_sender_delay)
        if layout == "none":
            return None
        sw, dev, mtu = self.topo.switch_ns, self.topo.port_dev(dst), self.topo.mtu
        link = replace(self.plan.links[(src, dst)], latency_ms=self._latency_ms[(src, dst)])
        senders = peers_of(self.plan, dst)
        if layout == "root":
            fastest = max(htb_rate_bps(self._rate_mbit[(j, dst)], mtu) for j in senders)
            return cmd(sw, f"delay towards worker {dst}", "tc", "qdisc", "change", "dev", dev,
                        "root", "netem", *netem_args(link, fastest, mtu))
        minor = link_classid(senders.index(src))
        return cmd(sw, f"delay {src}->{dst}", "tc", "qdisc", "change", "dev", dev, "parent",
                    f"1:{minor:x}", "handle", f"{minor:x}:", "netem",
                    *netem_args(link, htb_rate_bps(self._rate_mbit[(src, dst)], mtu), mtu))


def _changed_flow(t: Tree, peer: int) -> list[Command]:
    """``tc class change`` of the link class of ``peer`` in tree ``t`` and of its children."""
    index = next(i for i, flow in enumerate(t.flows) if flow.peer == peer)
    cap_bps = tree_cap_bps(t)
    parent = "1:" if cap_bps is None else "1:1"
    return link_classes(t, parent, index, t.flows[index], cap_bps, verb="change")


def link_change_commands(plan: LinkPlan, topo: NetTopology, decision: Decision, rank: int,
                         peer: int, *, rate_mbit: float | None = None,
                         latency_ms: float | None = None,
                         per_sender_delay: bool = False) -> list[Command]:
    """The commands that change rank -> peer (``LiveLinks.change``) on a network set up from
    ``plan`` and not changed since.

    A run that changes links more than once keeps one ``LiveLinks`` instead: with the set-up
    plan, this function would size GSO from the set-up rates of rank's other links and restate
    the set-up latency in a netem change, undoing earlier changes.
    """
    live = LiveLinks(plan, topo, decision, per_sender_delay=per_sender_delay)
    return live.change(rank, peer, rate_mbit=rate_mbit, latency_ms=latency_ms)
