"""Pure: a link plan + a topology -> the ``ip`` and ``tc`` commands that build the emulated network.

Nothing here runs anything; ``netem.namespaces`` runs the list and ``--dry-run`` prints it.

Topology: one network namespace per worker (``gl<run>-w<k>``) whose ``eth0`` is a veth into a
bridge ``br0`` in a "switch" namespace (``gl<run>-sw``), port ``p<k>``. Worker k has address
198.18.H.L/15 with H.L = k + 1 (RFC 2544 benchmarking space, never routed).

Egress of worker i (``eth0``), one HTB tree::

    1:      htb root; unclassified traffic (ARP, IPv6 ND) goes out directly, unshaped
    1:1     optional uplink cap of worker i: rate = ceil = up_mbit
    1:L_j   one class per peer j (u32 match on j's address): ceil = the link's rate
    1:L_j+1   prio 0 child for small packets (IP total length < 128: the TCP ACKs)
    1:L_j+2   prio 1 child for bulk data, ceil = the link's rate; each child has a
              ``pfifo limit 1000`` leaf


The ACK class is not optional: without it ACKs of the reverse direction queue behind bulk data
and flows on links used both ways fell to 63 % of their rate (docs/NETWORK.md). Short leaf queues
(a 50 ms bfifo) stalled TCP entirely, hence pfifo limit 1000.

The ACKs are not paid out of the link's rate: the link class i -> j also carries the ACKs of
j -> i's data, and HTB charges every byte a child sends to its parent's tokens
(``htb_charge_class`` walks up the tree in net/sched/sch_htb.c), so with link class = bulk ceil
= the link's rate, bulk data got the rate less the reverse flow's ACKs (66-byte frames per
one to four 1514-byte segments): 12 links of 4 workers at 20 Mbit/s, all busy, read 0.987-0.989
of their rate in every set-up, 0.999-1.000 with the room below (benchmarks/tc_shortfall.py
--ack-frame-b 0,78), while one link alone read 1.000 either way. The link class now has
``ack_headroom_bps`` of the reverse link's rate on top (``Flow.ack_mbit``) and the bulk child
keeps ceil = the link's rate, so data never exceeds the link and ACKs never take from it.

TCP hands veth GSO packets of up to 64 KiB, which HTB releases whole: a 1 Mbit/s link
delivered 64 KiB bursts every 0.52 s. Each worker's veth gets ``gso_max_segs`` so that one
packet holds at most ~10 ms of its slowest link (one segment below ~1.2 Mbit/s, 4 at 5 Mbit/s,
the kernel's 64 KiB from ~55 Mbit/s). 1 ms was smoother still but costs one packet per segment
on a worker's fast links too, and on 2 cores that cost 5-15 % of goodput at 4 x 50 Mbit/s.

HTB counts link-layer bytes: a full TCP segment of mtu - 52 payload bytes (20 IP + 32 TCP with
timestamps) costs mtu + 14 bytes. Every configured rate is scaled by (mtu + 14) / (mtu - 52)
so that measured goodput equals the number the user wrote (measured 95.6 % without it).

Download caps: ingress of ``eth0`` is redirected (mirred) to an ifb device that carries the same
tree, matching ``ip src`` under a class of rate = ceil = down_mbit.

Delay, jitter and loss (only where the kernel has netem) sit on the switch port towards the
destination, i.e. *after* the sender's rate limiter: a netem leaf inside the sender's HTB would
start its delay at enqueue, so queueing behind the rate limit would hide the delay instead of
adding to it. Where the kernel has no netem, latency is the receiver's release queue
(``netem.userspace``) and no command is emitted for it.

Changing links while a run goes on (``LiveLinks``, ``link_change_commands``): a directed link
i -> j is enforced by i's egress class for j and, where j has a download cap, by j's ifb class
for i; both are changed with ``tc class change`` (never deleted and re-added, so queued packets
and filters survive), with the rates, burst and quantum that set-up would have given them, and
i's ``gso_max_segs`` follows its slowest link. Latency is netem's (``tc qdisc change``); without
netem it is the receiver's release queue and the change belongs there. A cut (rate 0, a
partition) drops at the link's two leaf queues (``CUT_LEAF_LIMIT_PKTS``, see there).
"""
from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from netem import delay as delay_modes
from netem import tcpsettings
from netem.capabilities import CapabilityError, Decision
from netem.profiles import DEFAULT_QUEUE_PKTS, RATE_RANGE_MBIT, LinkPlan

WORKER_DEV = "eth0"

IFB_DEV = "ifb0"

BRIDGE_DEV = "br0"

PREFIX_LEN = 15                 # 198.18.0.0/15

LEAF_LIMIT_PKTS = DEFAULT_QUEUE_PKTS   # pfifo limit; see the module docstring

ACK_MAX_IP_BYTES = 128          # "small packet" = IP total length below this

# ACK bytes per link-layer byte of the data they acknowledge, worst case: one ACK per full
# segment (quickack, or GRO off on veth), its frame 14 + 20 + 32 (timestamps) + 12 (one SACK
# block) = 78 bytes against mtu + 14 = 1514. Room only: the small-packet child may use it, bulk
# is held to the link's rate by its own ceil.
ACK_FRAME_B = 78

# HTB burst and cburst: 1 ms of the class's rate, at least two frames. A 10 ms burst was tried:
# it recovered flows of the loaded 8-worker all-to-all that a late qdisc watchdog starves
# (``htb_accnt_tokens`` caps tokens at the burst), but it let a message after idle cross a
# slow link 10 % faster than its rate (tests/net/test_run_shaped.py's int8 run read 8.83 of
# 8 Mbit/s), which is the error users see; the ACK room above is what holds the rate.
BURST_S = 0.001

GSO_MAX_SEGS = 65_535          # the kernel's default and upper bound

GSO_BURST_S = 0.01            # one GSO packet holds at most ~10 ms of the slowest link

MAX_QUANTUM_B = 200_000         # the kernel's upper bound before it complains

PASS_RATE_BPS = 100 * 10**9    # a class that must never limit (the delay tree)

# A cut link (rate 0, a partition): both pfifo leaves of the sender's link class get this limit
# (``tc qdisc change``), so every packet to that peer is dropped on arrival, ACKs and small
# control messages included, while the class, its filters and what is already queued stay (the
# queue drains at the rate in force: ~0.3 s of data at 5 Mbit/s, measured). Restoring the limit
# reopens the link; a TCP connection that lived through a 3-6 s cut moved data again within
# 0.5 s of the restore, at the full rate (its retransmission timer's backoff). Not chosen: HTB
# has no rate 0, and a trickle rate (8 kbit/s) is no partition (64-byte messages crossed it in
# 0.15 ms) and leaves the class in token debt for up to a packet's time at that rate (up to
# HTB's 60 s cap with 64 KiB GSO packets): a link restored to 5 Mbit/s carried 0.08 Mbit/s for
# the next 4 s. gact and police, which could drop instead, are not in every kernel.
CUT_LEAF_LIMIT_PKTS = 0

RUN_ID_RE = re.compile(r"^[0-9a-f]{1,12}$")

NETNS_RE = re.compile(r"^gl([0-9a-f]{1,12})-(sw|w\d+)$")   # the names we create, and only those


@dataclass(frozen=True)
class Command:
    """One command as data: its argv, the network namespace it runs in (None = ours), and why."""

    argv: tuple[str, ...]
    netns: str | None = None
    desc: str = ""

    @property
    def tool(self) -> str:
        return self.argv[0]

    def full_argv(self) -> list[str]:
        """The argv to execute: ``ip -n NS ...`` / ``tc -n NS ...``, else ``ip netns exec NS
        ...``."""
        if self.netns is None:
            return list(self.argv)
        if self.tool in ("ip", "tc"):
            return [self.tool, "-n", self.netns, *self.argv[1:]]
        return ["ip", "netns", "exec", self.netns, *self.argv]

    def __str__(self) -> str:
        return shlex.join(self.full_argv())


def cmd(netns: str | None, desc: str, *argv: object) -> Command:
    return Command(tuple(str(a) for a in argv), netns, desc)


@dataclass(frozen=True)
class NetTopology:
    """Names and addresses of one run's namespaces; ``run_id`` keeps runs apart (hex, 1-12
    chars)."""

    run_id: str
    workers: int
    mtu: int = 1500

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not RUN_ID_RE.match(self.run_id):
            raise ValueError(f"run_id = {self.run_id!r} is not allowed; expected 1-12 lowercase "
                             "hex digits")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) \
                or not 1 <= self.workers <= 65_534:
            raise ValueError(f"workers = {self.workers!r} is out of range; expected 1..65534")
        if isinstance(self.mtu, bool) or not isinstance(self.mtu, int) \
                or not 576 <= self.mtu <= 65_535:
            raise ValueError(f"mtu = {self.mtu!r} is out of range; expected 576..65535")

    @property
    def prefix(self) -> str:
        return f"gl{self.run_id}-"

    def worker_ns(self, rank: int) -> str:
        return f"{self.prefix}w{rank}"

    @property
    def switch_ns(self) -> str:
        return f"{self.prefix}sw"

    def namespaces(self) -> list[str]:
        """Every namespace of the run, the switch first."""
        return [self.switch_ns] + [self.worker_ns(k) for k in range(self.workers)]

    def address(self, rank: int) -> str:
        host = rank + 1
        return f"198.18.{host >> 8}.{host & 255}"

    def port_dev(self, rank: int) -> str:
        return f"p{rank}"


def topology_commands(topo: NetTopology, bridge: bool = True) -> list[Command]:
    """Namespaces, the switch, and one veth per worker into it, all links up.

    ``bridge``: the switch is the kernel's bridge. Without it the ports stand alone in the
    switch namespace and the packet delay line (``netem.packetline``) forwards between them."""
    sw, mtu = topo.switch_ns, topo.mtu
    out = [cmd(None, f"namespace {ns}", "ip", "netns", "add", ns) for ns in topo.namespaces()]
    out.append(cmd(sw, "switch loopback up", "ip", "link", "set", "lo", "up"))
    if bridge:
        out += [cmd(sw, "the switch", "ip", "link", "add", BRIDGE_DEV, "mtu", mtu, "type",
                    "bridge"),
                cmd(sw, "switch up", "ip", "link", "set", BRIDGE_DEV, "up")]
    for k in range(topo.workers):
        out += _worker_link_commands(topo, k, bridge)
    return out


def _port_up(topo: NetTopology, k: int, bridge: bool) -> Command:
    sw, port = topo.switch_ns, topo.port_dev(k)
    if bridge:
        return cmd(sw, f"plug worker {k} into the bridge", "ip", "link", "set", port, "master",
                    BRIDGE_DEV, "up")
    # promiscuous: the line's packet socket takes every frame the worker sends, whatever its
    # destination MAC address
    return cmd(sw, f"worker {k}'s port up for the packet line", "ip", "link", "set", port,
                "promisc", "on", "up")


def _worker_link_commands(topo: NetTopology, k: int, bridge: bool = True) -> list[Command]:
    ns, port = topo.worker_ns(k), topo.port_dev(k)
    return [
        cmd(ns, f"worker {k} loopback up", "ip", "link", "set", "lo", "up"),
        cmd(ns, f"worker {k} veth into the switch", "ip", "link", "add", WORKER_DEV, "mtu",
             topo.mtu, "type", "veth", "peer", "name", port, "mtu", topo.mtu, "netns",
             topo.switch_ns),
        _port_up(topo, k, bridge),
        cmd(ns, f"worker {k} address", "ip", "addr", "add",
             f"{topo.address(k)}/{PREFIX_LEN}", "dev", WORKER_DEV),
        cmd(ns, f"worker {k} link up", "ip", "link", "set", WORKER_DEV, "up"),
    ]


def teardown_commands(topo: NetTopology) -> list[Command]:
    """Deleting a namespace deletes its veth (and the peer), ifb and qdiscs with it."""
    return [cmd(None, f"remove namespace {ns}", "ip", "netns", "del", ns)
            for ns in reversed(topo.namespaces())]


def overhead_factor(mtu: int) -> float:
    """Link-layer bytes per goodput byte of a full TCP segment: (mtu + 14) / (mtu - 52)."""
    return (mtu + 14) / (mtu - 52)


def htb_rate_bps(rate_mbit: float, mtu: int) -> int:
    """The HTB rate (bit/s) that yields ``rate_mbit`` of goodput."""
    return max(8, round(rate_mbit * 1e6 * overhead_factor(mtu)))


def _bit(bps: int) -> str:
    return f"{bps}bit"


def burst_args(bps: int, mtu: int) -> list[str]:
    """burst/cburst of BURST_S at this rate but at least two frames; quantum rate/10 within
    bounds."""
    frame = mtu + 14
    burst = max(2 * frame, math.ceil(bps / 8 * BURST_S))
    quantum = min(MAX_QUANTUM_B, max(frame, bps // 80))
    return ["burst", f"{burst}b", "cburst", f"{burst}b", "quantum", str(quantum)]


@dataclass(frozen=True)
class Flow:
    """Traffic to (egress) or from (ingress) one peer, with the link's goodput rate."""

    peer: int
    address: str
    rate_mbit: float
    queue_pkts: int = LEAF_LIMIT_PKTS     # the bulk leaf's limit: the link's bottleneck queue
    ack_mbit: float = 0.0     # goodput rate of the reverse link, whose ACKs this class carries


def ack_headroom_bps(reverse_mbit: float, mtu: int) -> int:
    """Room for the ACKs of ``reverse_mbit`` of data (``ACK_FRAME_B`` per full frame), bit/s."""
    if reverse_mbit <= 0:
        return 0
    return math.ceil(htb_rate_bps(reverse_mbit, mtu) * ACK_FRAME_B / (mtu + 14))


@dataclass(frozen=True)
class Tree:
    netns: str
    dev: str
    match: str                      # 'dst' on egress, 'src' on the ifb (ingress)
    mtu: int
    cap_mbit: float | None = None
    flows: tuple[Flow, ...] = field(default_factory=tuple)


def link_classid(index: int) -> int:
    """Minor id of the link class of the index-th flow; +1 is its ACK child, +2 its bulk child."""
    return 0x10 + 3 * index


def _htb_class(t: Tree, parent: str, minor: int, rate: int, ceil: int, desc: str,
               prio: int | None = None, verb: str = "add") -> Command:
    """``tc class add`` (or ``change``, which takes the same arguments: options left out are
    reset, prio to 0, so a change restates them all)."""
    extra = [] if prio is None else ["prio", prio]
    return cmd(t.netns, desc, "tc", "class", verb, "dev", t.dev, "parent", parent, "classid",
                f"1:{minor:x}", "htb", "rate", _bit(rate), "ceil", _bit(ceil), *extra,
                *burst_args(ceil, t.mtu))


def tree_cap_bps(t: Tree) -> int | None:
    return None if t.cap_mbit is None else htb_rate_bps(t.cap_mbit, t.mtu)


def _tree_commands(t: Tree) -> list[Command]:
    out = [cmd(t.netns, f"HTB root on {t.dev}", "tc", "qdisc", "add", "dev", t.dev, "root",
                "handle", "1:", "htb")]
    parent, cap_bps = "1:", tree_cap_bps(t)
    if cap_bps is not None:
        kind = "uplink" if t.match == "dst" else "downlink"
        out.append(_htb_class(t, "1:", 1, cap_bps, cap_bps, f"{kind} cap {t.cap_mbit:g} Mbit/s"))
        parent = "1:1"
    for index, flow in enumerate(t.flows):
        out += _flow_commands(t, parent, index, flow, cap_bps)
    return out


@dataclass(frozen=True)
class ClassRates:
    """Rates of one link class and its two children, bit/s (HTB's rate and ceil)."""

    rate: int
    ceil: int
    ack_rate: int
    bulk_rate: int
    bulk_ceil: int


def class_rates(link_rate_bps: int, cap_bps: int | None, flows: int,
                ack_bps: int = 0) -> ClassRates:
    """A link class, its ACK child and its bulk child.

    The link class has the link's rate plus ``ack_bps`` (room for the reverse flow's ACKs, see
    the module docstring); the bulk child's ceil is the link's rate alone. Under a cap,
    guaranteed rates of the link classes must not add up past the cap: HTB lets a class below
    its own rate send without asking its parent. The ACK child is guaranteed ``ack_bps`` (half
    the class's rate where there is no headroom, or the headroom is more), bulk the rest.
    """
    rate = ceil = link_rate_bps + ack_bps
    bulk_ceil = link_rate_bps
    if cap_bps is not None:
        ceil = min(ceil, cap_bps)
        bulk_ceil = min(bulk_ceil, cap_bps)
        rate = max(8, min(ceil, cap_bps // flows))
    ack_rate = max(8, rate // 2 if ack_bps <= 0 else min(ack_bps, rate // 2))
    return ClassRates(rate, ceil, ack_rate, max(8, min(bulk_ceil, rate - ack_rate)), bulk_ceil)


def link_classes(t: Tree, parent: str, index: int, flow: Flow, cap_bps: int | None,
                  verb: str = "add") -> list[Command]:
    """The link class of one peer and its ACK (prio 0) and bulk (prio 1) children."""
    r = class_rates(htb_rate_bps(flow.rate_mbit, t.mtu), cap_bps, len(t.flows),
                    ack_headroom_bps(flow.ack_mbit, t.mtu))
    minor = link_classid(index)
    arrow = f"->{flow.peer}" if t.match == "dst" else f"<-{flow.peer}"
    return [
        _htb_class(t, parent, minor, r.rate, r.ceil, f"link {arrow} {flow.rate_mbit:g} Mbit/s",
                   verb=verb),
        _htb_class(t, f"1:{minor:x}", minor + 1, r.ack_rate, r.ceil,
                   f"link {arrow} small packets", 0, verb),
        _htb_class(t, f"1:{minor:x}", minor + 2, r.bulk_rate, r.bulk_ceil, f"link {arrow} bulk",
                   1, verb),
    ]


def _flow_commands(t: Tree, parent: str, index: int, flow: Flow,
                   cap_bps: int | None) -> list[Command]:
    """The link class of one peer, its ACK and bulk children, their leaves and filters."""
    minor = link_classid(index)
    return link_classes(t, parent, index, flow, cap_bps) + [
        leaf_command(t, minor + 1), leaf_command(t, minor + 2, limit_pkts=flow.queue_pkts),
        _filter(t, 1, flow.address, minor + 1, small=True),
        _filter(t, 2, flow.address, minor + 2, small=False),
    ]


def leaf_command(t: Tree, minor: int, verb: str = "add", limit_pkts: int = LEAF_LIMIT_PKTS,
          desc: str = "leaf queue") -> Command:
    return cmd(t.netns, desc, "tc", "qdisc", verb, "dev", t.dev, "parent", f"1:{minor:x}",
                "handle", f"{minor:x}:", "pfifo", "limit", limit_pkts)


def _filter(t: Tree, prio: int, address: str, minor: int, small: bool) -> Command:
    # IP total length (bytes 2-3 of the header) < 128 <=> its top nine bits are zero
    size = (["match", "u16", "0x0000", f"0x{0xffff & ~(ACK_MAX_IP_BYTES - 1):04x}", "at", "2"]
            if small else [])
    what = "small packets" if small else "bulk"
    return cmd(t.netns, f"classify {what} {t.match} {address}", "tc", "filter", "add", "dev",
                t.dev, "parent", "1:", "protocol", "ip", "prio", prio, "u32", "match", "ip",
                t.match, f"{address}/32", *size, "flowid", f"1:{minor:x}")


def gso_segments(rate_mbit: float, mtu: int) -> int:
    """Segments per GSO packet so that one packet is at most ~GSO_BURST_S of the link's time.

    veth passes TCP's 64 KiB GSO packets through whole and HTB releases one at once: on a
    1 Mbit/s link that is 0.5 s of data in one burst, then 0.5 s of silence (measured).
    """
    frame_bits = (mtu + 14) * 8
    return max(1, min(GSO_MAX_SEGS, int(htb_rate_bps(rate_mbit, mtu) * GSO_BURST_S // frame_bits)))


def peers_of(plan: LinkPlan, rank: int) -> list[int]:
    return [j for j in range(plan.workers) if j != rank]


def egress_tree(plan: LinkPlan, topo: NetTopology, rank: int,
                 rates: dict[tuple[int, int], float] | None = None) -> Tree:
    """Worker ``rank``'s egress tree; ``rates`` (goodput Mbit/s, 0 = cut) replace the plan's."""
    rate = (lambda key: plan.links[key].rate_mbit) if rates is None else rates.__getitem__
    flows = tuple(Flow(j, topo.address(j), rate((rank, j)), plan.links[(rank, j)].queue_pkts,
                       ack_mbit=rate((j, rank)))
                  for j in peers_of(plan, rank))
    return Tree(topo.worker_ns(rank), WORKER_DEV, "dst", topo.mtu, plan.cap(rank).up_mbit, flows)


def ingress_tree(plan: LinkPlan, topo: NetTopology, rank: int,
                  rates: dict[tuple[int, int], float] | None = None) -> Tree:
    """Worker ``rank``'s download tree on the ifb (only built when it has a download cap)."""
    rate = (lambda key: plan.links[key].rate_mbit) if rates is None else rates.__getitem__
    flows = tuple(Flow(j, topo.address(j), rate((j, rank)), ack_mbit=rate((rank, j)))
                  for j in peers_of(plan, rank))
    return Tree(topo.worker_ns(rank), IFB_DEV, "src", topo.mtu, plan.cap(rank).down_mbit, flows)


def gso_command(topo: NetTopology, rank: int, slowest_mbit: float) -> Command:
    segs = gso_segments(slowest_mbit, topo.mtu)
    return cmd(topo.worker_ns(rank), f"worker {rank}: GSO packets of at most {segs} segments "
                f"(~{GSO_BURST_S * 1e3:g} ms at {slowest_mbit:g} Mbit/s)",
                "ip", "link", "set", "dev", WORKER_DEV, "gso_max_segs", segs)


def egress_commands(plan: LinkPlan, topo: NetTopology, rank: int,
                    gso_floor_mbit: float = math.inf) -> list[Command]:
    """``gso_floor_mbit``: the slowest rate this worker's links will take later in the run (a
    scenario's link changes). A TCP connection keeps the GSO size of its set-up, so a link
    slowed in place would otherwise carry packets sized for its old rate, and HTB releases
    each one whole (a 482 kB message read 9 % fast at 5 Mbit/s after 50)."""
    if not peers_of(plan, rank):
        return []
    slowest = min([plan.effective_rate_mbit(rank, j) for j in peers_of(plan, rank)]
                  + [gso_floor_mbit])
    return [gso_command(topo, rank, slowest)] + _tree_commands(egress_tree(plan, topo, rank))


def ingress_commands(plan: LinkPlan, topo: NetTopology, rank: int) -> list[Command]:
    """Download cap: eth0's ingress -> ifb0 (mirred), where an HTB tree matches ``ip src``."""
    down = plan.cap(rank).down_mbit
    if down is None or not peers_of(plan, rank):
        return []
    ns = topo.worker_ns(rank)
    out = [cmd(ns, f"worker {rank} download device", "ip", "link", "add", IFB_DEV, "mtu", topo.mtu,
                "type", "ifb"),
           cmd(ns, f"worker {rank} download device up", "ip", "link", "set", IFB_DEV, "up"),
           cmd(ns, "ingress hook", "tc", "qdisc", "add", "dev", WORKER_DEV, "handle", "ffff:",
                "ingress"),
           cmd(ns, "redirect arriving IP packets to the download device", "tc", "filter", "add",
                "dev", WORKER_DEV, "parent", "ffff:", "protocol", "ip", "prio", 1, "u32", "match",
                "u32", 0, 0, "action", "mirred", "egress", "redirect", "dev", IFB_DEV)]
    return out + _tree_commands(ingress_tree(plan, topo, rank))


def netem_args(link, rate_bps: int, mtu: int) -> list[str]:
    """netem's arguments (tc-netem(8)); its queue holds every packet in flight over the delay
    (ACK-sized worst case). Bursty loss is netem's 4-state-less ``gemodel p r 1-h``; with both a
    random and a bursty loss netem keeps only one, so the packet line is used for that mix."""
    delay_s = (link.latency_ms + link.jitter_ms) / 1e3
    limit = LEAF_LIMIT_PKTS + math.ceil(rate_bps / 8 * delay_s / 64)
    args = ["delay", f"{link.latency_ms:g}ms"]
    if link.jitter_ms:
        args += [f"{link.jitter_ms:g}ms", "distribution", link.jitter_dist]
    if link.reorder_pct:
        args += ["reorder", f"{link.reorder_pct:g}%"]
    if link.ge_p_pct:
        args += ["loss", "gemodel", f"{link.ge_p_pct:g}%", f"{link.ge_r_pct:g}%",
                 f"{link.ge_bad_loss_pct:g}%"]
    elif link.loss_pct:
        args += ["loss", f"{link.loss_pct:g}%"]
    return args + ["limit", str(limit)]


def _netem_shape(link) -> tuple:
    return (link.latency_ms, link.jitter_ms, link.loss_pct, link.jitter_dist, link.reorder_pct,
            link.ge_p_pct, link.ge_r_pct, link.ge_bad_loss_pct)


def delay_layout(plan: LinkPlan, rank: int, per_sender: bool = False) -> str:
    """How netem delays traffic towards ``rank``: 'none', 'root' (one qdisc for every sender) or
    'tree' (an HTB tree with one netem per sender).

    One qdisc where all senders look alike keeps the common case cheap; ``per_sender`` asks for
    the tree regardless (delay 0 included), which is what lets a run change one sender's latency
    later: a shared qdisc cannot be changed for one of its senders alone.
    """
    links = [plan.links[(j, rank)] for j in peers_of(plan, rank)]
    if per_sender and links:
        return "tree"
    if not any(link.impaired for link in links):
        return "none"
    shapes = {_netem_shape(link) for link in links}
    return "root" if len(shapes) == 1 else "tree"


def delay_commands(plan: LinkPlan, topo: NetTopology, rank: int,
                   per_sender: bool = False) -> list[Command]:
    """netem on the switch port towards ``rank``: one qdisc when all senders look alike, else per
    sender (see ``delay_layout``)."""
    layout = delay_layout(plan, rank, per_sender)
    if layout == "none":
        return []
    links = [plan.links[(j, rank)] for j in peers_of(plan, rank)]
    sw, dev = topo.switch_ns, topo.port_dev(rank)
    if layout == "root":
        fastest = max(htb_rate_bps(link.rate_mbit, topo.mtu) for link in links)
        return [cmd(sw, f"delay towards worker {rank}", "tc", "qdisc", "add", "dev", dev, "root",
                     "netem", *netem_args(links[0], fastest, topo.mtu))]
    out = [cmd(sw, f"delay tree towards worker {rank}", "tc", "qdisc", "add", "dev", dev, "root",
                "handle", "1:", "htb")]
    for index, link in enumerate(links):
        out += _delay_class(topo, rank, index, link)
    return out


def _delay_class(topo: NetTopology, rank: int, index: int, link) -> list[Command]:
    sw, dev, minor = topo.switch_ns, topo.port_dev(rank), link_classid(index)
    desc = f"delay {link.src}->{rank}"
    return [
        cmd(sw, desc, "tc", "class", "add", "dev", dev, "parent", "1:", "classid", f"1:{minor:x}",
             "htb", "rate", _bit(PASS_RATE_BPS), "ceil", _bit(PASS_RATE_BPS),
             *burst_args(PASS_RATE_BPS, topo.mtu)),   # tc's default burst at this rate is 0
        cmd(sw, desc, "tc", "qdisc", "add", "dev", dev, "parent", f"1:{minor:x}", "handle",
             f"{minor:x}:", "netem",
             *netem_args(link, htb_rate_bps(link.rate_mbit, topo.mtu), topo.mtu)),
        cmd(sw, desc, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
             1, "u32", "match", "ip", "src", f"{topo.address(link.src)}/32", "flowid",
             f"1:{minor:x}"),
    ]


def check_supported(plan: LinkPlan, decision: Decision, host_tcp=None) -> None:
    """Refuse, before anything exists, what the chosen shaper and delay mode cannot do.

    ``host_tcp``: the host's TCP (``tcpsettings.read_host()``), to refuse a congestion control
    its kernel lacks; None reads it when the plan sets TCP."""
    kind = decision.shaper_kind
    if not kind.shapes or not plan.shaped:
        return
    try:
        delay_modes.check_plan(plan, decision.delay_mode, kind.name)
    except delay_modes.DelayModeError as exc:
        raise CapabilityError(str(exc)) from None
    kind.check_plan(plan, decision)
    _check_tcp(plan, host_tcp)


def check_down_caps(plan: LinkPlan, caps) -> None:
    """Download caps (a tree on an ifb device per worker) need ifb, ingress and mirred, where
    the kernel was probed (``caps``: None when it was not)."""
    if not plan.has_caps("down") or caps is None:
        return
    missing = [f for f in ("ifb", "ingress", "mirred") if not caps.has(f)]
    if missing:
        raise CapabilityError(f"download caps (down_mbit) need {', '.join(missing)}, which "
                              f"this kernel lacks: {caps.errors.get(missing[0], '')}")


def check_default_queues(plan: LinkPlan, decision: Decision) -> None:
    """A bottleneck queue lives in the tc shaper's leaves: a shaper without them refuses any
    other. (TCP settings without namespaces are the host's: compared with it and warned about,
    ``netem.namespaces.tcp_record``.)"""
    queues = {link.queue_pkts for link in plan.links.values()} - {LEAF_LIMIT_PKTS}
    if queues:
        raise CapabilityError(f"net.queue_pkts = {min(queues)} needs the tc shaper (its leaf "
                              f"queues), and this run has shaper {decision.shaper!r}; leave it "
                              f"at {LEAF_LIMIT_PKTS} or use net.shaper = 'tc'")


def _check_tcp(plan: LinkPlan, host_tcp) -> None:
    settings = [link.tcp for link in plan.links.values() if not link.tcp.is_default]
    if not settings:
        return
    host = host_tcp if host_tcp is not None else tcpsettings.read_host()
    try:
        tcpsettings.check_possible(settings, host)
        for k in range(plan.workers):
            tcpsettings.check_one_sender(k, {j: plan.links[(k, j)].tcp
                                             for j in peers_of(plan, k)})
    except tcpsettings.TcpSettingsError as exc:
        raise CapabilityError(str(exc)) from None


def tcp_commands(plan: LinkPlan, topo: NetTopology, rank: int, host_tcp) -> list[Command]:
    """Worker ``rank``'s TCP as its links ask (``netem.tcpsettings``): sysctls of its namespace,
    then the route to every peer with the congestion control and initial window, and a /32
    route for each peer whose link differs from the rest."""
    peers = peers_of(plan, rank)
    if not peers:
        return []
    ns, per_peer = topo.worker_ns(rank), {j: plan.links[(rank, j)].tcp for j in peers}
    common = max(per_peer.values(), key=list(per_peer.values()).count)
    out = [cmd(ns, f"worker {rank}: {name} = {value}", "sh", "-c",
                f"printf '%s\\n' '{value}' > /proc/sys/net/ipv4/{name}")
           for name, value in tcpsettings.sysctl_writes(common, host_tcp)]
    if common.route_args():
        out.append(cmd(ns, f"worker {rank}: TCP to every peer", "ip", "route", "replace",
                        f"198.18.0.0/{PREFIX_LEN}", "dev", WORKER_DEV, *common.route_args()))
    for j, settings in per_peer.items():
        if settings != common and settings.route_args():
            out.append(cmd(ns, f"worker {rank}: TCP to worker {j}", "ip", "route", "replace",
                            f"{topo.address(j)}/32", "dev", WORKER_DEV, *settings.route_args()))
    return out


def plan_commands(plan: LinkPlan, topo: NetTopology, decision: Decision, *,
                  per_sender_delay: bool = False,
                  gso_floor_mbit: Mapping[int, float] | None = None,
                  host_tcp=None, delayed_later: bool = False) -> list[Command]:
    """Every command that builds the run's network, in order; [] unless the shaper is tc.

    ``per_sender_delay``: one netem per sender on every switch port (``delay_layout``), for runs
    that will change latencies of single links (``LiveLinks`` must be told the same).
    ``gso_floor_mbit``: per worker, the slowest rate its links will be changed to during the
    run (``egress_commands``; ``LiveLinks`` must be told the same). ``host_tcp``: the host's
    TCP (``tcpsettings.read_host``), read when the plan sets TCP and this is None.
    ``delayed_later``: a scenario will give some link a latency (``DelayMode.replaces_bridge``)."""
    if topo.workers != plan.workers:
        raise ValueError(f"topology has {topo.workers} workers, the plan {plan.workers}")
    if host_tcp is None and any(not link.tcp.is_default for link in plan.links.values()):
        host_tcp = tcpsettings.read_host()      # once, for the check and the commands
    check_supported(plan, decision, host_tcp)
    if not decision.shaper_kind.worker_namespaces:
        return []
    mode = decision.delay_mode
    out = topology_commands(topo, bridge=not mode.replaces_bridge(plan, delayed_later))
    if not plan.shaped:
        return out
    for k in range(plan.workers):
        floor = (gso_floor_mbit or {}).get(k, math.inf)
        out += egress_commands(plan, topo, k, floor) + ingress_commands(plan, topo, k)
        if host_tcp is not None:
            out += tcp_commands(plan, topo, k, host_tcp)
        out += mode.port_commands(plan, topo, k, per_sender_delay)
    return out


def check_number(what: str, value: object, lo: float, hi: float, note: str = "") -> float:
    """``value`` as a finite float in [lo, hi], else a ValueError naming it and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} = {value!r} is not a number")
    v = float(value)
    if not (math.isfinite(v) and lo <= v <= hi):
        raise ValueError(f"{what} = {value!r} is out of range; expected a value in "
                         f"[{lo:g}, {hi:g}]{note}")
    return v


def check_rate_mbit(what: str, value: object) -> float:
    """A link's new goodput rate in Mbit/s: 0 (a cut) up to the profiles' largest rate."""
    return check_number(what, value, 0.0, RATE_RANGE_MBIT[1], " (0 cuts the link)")
