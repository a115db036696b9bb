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
    1:L_j+2   prio 1 child for bulk data; each child has a ``pfifo limit 1000`` leaf

The ACK class is not optional: without it ACKs of the reverse direction queue behind bulk data
and flows on links used both ways fell to 63 % of their rate (docs/NETWORK.md). Short leaf queues
(a 50 ms bfifo) stalled TCP entirely, hence pfifo limit 1000.

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
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field

from .capabilities import CapabilityError, Decision
from .profiles import LinkPlan

WORKER_DEV = "eth0"
IFB_DEV = "ifb0"
BRIDGE_DEV = "br0"
PREFIX_LEN = 15                 # 198.18.0.0/15
LEAF_LIMIT_PKTS = 1000          # pfifo limit; see the module docstring
ACK_MAX_IP_BYTES = 128          # "small packet" = IP total length below this
BURST_S = 0.001                 # HTB burst: 1 ms of data (what tc's HZ=1000 default used to give)
GSO_MAX_SEGS = 65_535          # the kernel's default and upper bound
GSO_BURST_S = 0.01            # one GSO packet holds at most ~10 ms of the slowest link
MAX_QUANTUM_B = 200_000         # the kernel's upper bound before it complains
PASS_RATE_BPS = 100 * 10**9    # a class that must never limit (the delay tree)
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


def _cmd(netns: str | None, desc: str, *argv: object) -> Command:
    return Command(tuple(str(a) for a in argv), netns, desc)


# ---------------------------------------------------------------- topology

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


def topology_commands(topo: NetTopology) -> list[Command]:
    """Namespaces, the bridge, and one veth per worker into it, all links up."""
    sw, mtu = topo.switch_ns, topo.mtu
    out = [_cmd(None, f"namespace {ns}", "ip", "netns", "add", ns) for ns in topo.namespaces()]
    out += [_cmd(sw, "switch loopback up", "ip", "link", "set", "lo", "up"),
            _cmd(sw, "the switch", "ip", "link", "add", BRIDGE_DEV, "mtu", mtu, "type", "bridge"),
            _cmd(sw, "switch up", "ip", "link", "set", BRIDGE_DEV, "up")]
    for k in range(topo.workers):
        out += _worker_link_commands(topo, k)
    return out


def _worker_link_commands(topo: NetTopology, k: int) -> list[Command]:
    ns, sw, port = topo.worker_ns(k), topo.switch_ns, topo.port_dev(k)
    return [
        _cmd(ns, f"worker {k} loopback up", "ip", "link", "set", "lo", "up"),
        _cmd(ns, f"worker {k} veth into the switch", "ip", "link", "add", WORKER_DEV, "mtu",
             topo.mtu, "type", "veth", "peer", "name", port, "mtu", topo.mtu, "netns", sw),
        _cmd(sw, f"plug worker {k} into the bridge", "ip", "link", "set", port, "master",
             BRIDGE_DEV, "up"),
        _cmd(ns, f"worker {k} address", "ip", "addr", "add",
             f"{topo.address(k)}/{PREFIX_LEN}", "dev", WORKER_DEV),
        _cmd(ns, f"worker {k} link up", "ip", "link", "set", WORKER_DEV, "up"),
    ]


def teardown_commands(topo: NetTopology) -> list[Command]:
    """Deleting a namespace deletes its veth (and the peer), ifb and qdiscs with it."""
    return [_cmd(None, f"remove namespace {ns}", "ip", "netns", "del", ns)
            for ns in reversed(topo.namespaces())]


# ---------------------------------------------------------------- rates

def overhead_factor(mtu: int) -> float:
    """Link-layer bytes per goodput byte of a full TCP segment: (mtu + 14) / (mtu - 52)."""
    return (mtu + 14) / (mtu - 52)


def htb_rate_bps(rate_mbit: float, mtu: int) -> int:
    """The HTB rate (bit/s) that yields ``rate_mbit`` of goodput."""
    return max(8, round(rate_mbit * 1e6 * overhead_factor(mtu)))


def _bit(bps: int) -> str:
    return f"{bps}bit"


def _burst_args(bps: int, mtu: int) -> list[str]:
    """burst/cburst of 1 ms at this rate but at least two frames; quantum rate/10 within bounds."""
    frame = mtu + 14
    burst = max(2 * frame, math.ceil(bps / 8 * BURST_S))
    quantum = min(MAX_QUANTUM_B, max(frame, bps // 80))
    return ["burst", f"{burst}b", "cburst", f"{burst}b", "quantum", str(quantum)]


# ---------------------------------------------------------------- HTB trees

@dataclass(frozen=True)
class Flow:
    """Traffic to (egress) or from (ingress) one peer, with the link's goodput rate."""

    peer: int
    address: str
    rate_mbit: float


@dataclass(frozen=True)
class _Tree:
    netns: str
    dev: str
    match: str                      # 'dst' on egress, 'src' on the ifb (ingress)
    mtu: int
    cap_mbit: float | None = None
    flows: tuple[Flow, ...] = field(default_factory=tuple)


def link_classid(index: int) -> int:
    """Minor id of the link class of the index-th flow; +1 is its ACK child, +2 its bulk child."""
    return 0x10 + 3 * index


def _htb_class(t: _Tree, parent: str, minor: int, rate: int, ceil: int, desc: str,
               prio: int | None = None) -> Command:
    extra = [] if prio is None else ["prio", prio]
    return _cmd(t.netns, desc, "tc", "class", "add", "dev", t.dev, "parent", parent, "classid",
                f"1:{minor:x}", "htb", "rate", _bit(rate), "ceil", _bit(ceil), *extra,
                *_burst_args(ceil, t.mtu))


def _tree_commands(t: _Tree) -> list[Command]:
    out = [_cmd(t.netns, f"HTB root on {t.dev}", "tc", "qdisc", "add", "dev", t.dev, "root",
                "handle", "1:", "htb")]
    parent, cap_bps = "1:", None
    if t.cap_mbit is not None:
        cap_bps = htb_rate_bps(t.cap_mbit, t.mtu)
        kind = "uplink" if t.match == "dst" else "downlink"
        out.append(_htb_class(t, "1:", 1, cap_bps, cap_bps, f"{kind} cap {t.cap_mbit:g} Mbit/s"))
        parent = "1:1"
    for index, flow in enumerate(t.flows):
        out += _flow_commands(t, parent, index, flow, cap_bps)
    return out


def _flow_commands(t: _Tree, parent: str, index: int, flow: Flow,
                   cap_bps: int | None) -> list[Command]:
    """The link class of one peer, its ACK and bulk children, their leaves and filters."""
    ceil = htb_rate_bps(flow.rate_mbit, t.mtu)
    rate = ceil
    if cap_bps is not None:
        # Guaranteed rates of the children must not add up past the cap: HTB lets a class
        # below its own rate send without asking its parent.
        ceil = min(ceil, cap_bps)
        rate = max(8, min(ceil, cap_bps // len(t.flows)))
    ack_rate = max(8, rate // 2)
    minor = link_classid(index)
    arrow = f"->{flow.peer}" if t.match == "dst" else f"<-{flow.peer}"
    return [
        _htb_class(t, parent, minor, rate, ceil, f"link {arrow} {flow.rate_mbit:g} Mbit/s"),
        _htb_class(t, f"1:{minor:x}", minor + 1, ack_rate, ceil, f"link {arrow} small packets", 0),
        _htb_class(t, f"1:{minor:x}", minor + 2, max(8, rate - ack_rate), ceil,
                   f"link {arrow} bulk", 1),
        _leaf(t, minor + 1), _leaf(t, minor + 2),
        _filter(t, 1, flow.address, minor + 1, small=True),
        _filter(t, 2, flow.address, minor + 2, small=False),
    ]


def _leaf(t: _Tree, minor: int) -> Command:
    return _cmd(t.netns, "leaf queue", "tc", "qdisc", "add", "dev", t.dev, "parent", f"1:{minor:x}",
                "handle", f"{minor:x}:", "pfifo", "limit", LEAF_LIMIT_PKTS)


def _filter(t: _Tree, prio: int, address: str, minor: int, small: bool) -> Command:
    # IP total length (bytes 2-3 of the header) < 128 <=> its top nine bits are zero
    size = (["match", "u16", "0x0000", f"0x{0xffff & ~(ACK_MAX_IP_BYTES - 1):04x}", "at", "2"]
            if small else [])
    what = "small packets" if small else "bulk"
    return _cmd(t.netns, f"classify {what} {t.match} {address}", "tc", "filter", "add", "dev",
                t.dev, "parent", "1:", "protocol", "ip", "prio", prio, "u32", "match", "ip",
                t.match, f"{address}/32", *size, "flowid", f"1:{minor:x}")


# ---------------------------------------------------------------- per worker

def gso_segments(rate_mbit: float, mtu: int) -> int:
    """Segments per GSO packet so that one packet is at most ~GSO_BURST_S of the link's time.

    veth passes TCP's 64 KiB GSO packets through whole and HTB releases one at once: on a
    1 Mbit/s link that is 0.5 s of data in one burst, then 0.5 s of silence (measured).
    """
    frame_bits = (mtu + 14) * 8
    return max(1, min(GSO_MAX_SEGS, int(htb_rate_bps(rate_mbit, mtu) * GSO_BURST_S // frame_bits)))


def egress_commands(plan: LinkPlan, topo: NetTopology, rank: int) -> list[Command]:
    peers = [j for j in range(plan.workers) if j != rank]
    if not peers:
        return []
    ns = topo.worker_ns(rank)
    flows = tuple(Flow(j, topo.address(j), plan.links[(rank, j)].rate_mbit) for j in peers)
    slowest = min(plan.effective_rate_mbit(rank, j) for j in peers)
    segs = gso_segments(slowest, topo.mtu)
    gso = _cmd(ns, f"worker {rank}: GSO packets of at most {segs} segments "
                   f"(~{GSO_BURST_S * 1e3:g} ms at {slowest:g} Mbit/s)",
               "ip", "link", "set", "dev", WORKER_DEV, "gso_max_segs", segs)
    tree = _Tree(ns, WORKER_DEV, "dst", topo.mtu, plan.cap(rank).up_mbit, flows)
    return [gso] + _tree_commands(tree)


def ingress_commands(plan: LinkPlan, topo: NetTopology, rank: int) -> list[Command]:
    """Download cap: eth0's ingress -> ifb0 (mirred), where an HTB tree matches ``ip src``."""
    down = plan.cap(rank).down_mbit
    peers = [j for j in range(plan.workers) if j != rank]
    if down is None or not peers:
        return []
    ns = topo.worker_ns(rank)
    flows = tuple(Flow(j, topo.address(j), plan.links[(j, rank)].rate_mbit) for j in peers)
    out = [_cmd(ns, f"worker {rank} download device", "ip", "link", "add", IFB_DEV, "mtu", topo.mtu,
                "type", "ifb"),
           _cmd(ns, f"worker {rank} download device up", "ip", "link", "set", IFB_DEV, "up"),
           _cmd(ns, "ingress hook", "tc", "qdisc", "add", "dev", WORKER_DEV, "handle", "ffff:",
                "ingress"),
           _cmd(ns, "redirect arriving IP packets to the download device", "tc", "filter", "add",
                "dev", WORKER_DEV, "parent", "ffff:", "protocol", "ip", "prio", 1, "u32", "match",
                "u32", 0, 0, "action", "mirred", "egress", "redirect", "dev", IFB_DEV)]
    return out + _tree_commands(_Tree(ns, IFB_DEV, "src", topo.mtu, down, flows))


def _netem_args(link, rate_bps: int, mtu: int) -> list[str]:
    """netem's arguments; its queue holds every packet in flight over the delay (ACK-sized worst
    case)."""
    delay_s = (link.latency_ms + link.jitter_ms) / 1e3
    limit = LEAF_LIMIT_PKTS + math.ceil(rate_bps / 8 * delay_s / 64)
    args = ["delay", f"{link.latency_ms:g}ms"]
    if link.jitter_ms:
        args.append(f"{link.jitter_ms:g}ms")
    if link.loss_pct:
        args += ["loss", f"{link.loss_pct:g}%"]
    return args + ["limit", str(limit)]


def delay_commands(plan: LinkPlan, topo: NetTopology, rank: int) -> list[Command]:
    """netem on the switch port towards ``rank``: one qdisc when all senders look alike, else per
    sender."""
    links = [plan.links[(j, rank)] for j in range(plan.workers) if j != rank]
    if not any(link.latency_ms or link.jitter_ms or link.loss_pct for link in links):
        return []
    sw, dev = topo.switch_ns, topo.port_dev(rank)
    shapes = {(link.latency_ms, link.jitter_ms, link.loss_pct) for link in links}
    if len(shapes) == 1:
        fastest = max(htb_rate_bps(link.rate_mbit, topo.mtu) for link in links)
        return [_cmd(sw, f"delay towards worker {rank}", "tc", "qdisc", "add", "dev", dev, "root",
                     "netem", *_netem_args(links[0], fastest, topo.mtu))]
    out = [_cmd(sw, f"delay tree towards worker {rank}", "tc", "qdisc", "add", "dev", dev, "root",
                "handle", "1:", "htb")]
    for index, link in enumerate(links):
        out += _delay_class(topo, rank, index, link)
    return out


def _delay_class(topo: NetTopology, rank: int, index: int, link) -> list[Command]:
    sw, dev, minor = topo.switch_ns, topo.port_dev(rank), link_classid(index)
    desc = f"delay {link.src}->{rank}"
    return [
        _cmd(sw, desc, "tc", "class", "add", "dev", dev, "parent", "1:", "classid", f"1:{minor:x}",
             "htb", "rate", _bit(PASS_RATE_BPS), "ceil", _bit(PASS_RATE_BPS),
             *_burst_args(PASS_RATE_BPS, topo.mtu)),   # tc's default burst at this rate is 0
        _cmd(sw, desc, "tc", "qdisc", "add", "dev", dev, "parent", f"1:{minor:x}", "handle",
             f"{minor:x}:", "netem",
             *_netem_args(link, htb_rate_bps(link.rate_mbit, topo.mtu), topo.mtu)),
        _cmd(sw, desc, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio",
             1, "u32", "match", "ip", "src", f"{topo.address(link.src)}/32", "flowid",
             f"1:{minor:x}"),
    ]


# ---------------------------------------------------------------- the whole plan

def check_supported(plan: LinkPlan, decision: Decision) -> None:
    """Refuse, before anything exists, what the chosen shaper cannot do."""
    if decision.shaper == "none" or not plan.shaped:
        return
    caps = decision.caps
    for attr in ("jitter_ms", "loss_pct"):
        if plan.max_of(attr) and not (decision.shaper == "tc" and decision.delay == "netem"):
            raise CapabilityError(
                f"net.{attr} = {plan.max_of(attr):g} needs the netem qdisc, and this run has "
                f"shaper {decision.shaper!r} with delay {decision.delay!r}; set net.{attr} = 0 "
                "or run where the kernel has netem")
    if decision.shaper == "tc" and plan.has_caps("down") and caps is not None:
        missing = [f for f in ("ifb", "ingress", "mirred") if not caps.has(f)]
        if missing:
            raise CapabilityError(f"download caps (down_mbit) need {', '.join(missing)}, which "
                                  f"this kernel lacks: {caps.errors.get(missing[0], '')}")


def plan_commands(plan: LinkPlan, topo: NetTopology, decision: Decision) -> list[Command]:
    """Every command that builds the run's network, in order; [] unless the shaper is tc."""
    if topo.workers != plan.workers:
        raise ValueError(f"topology has {topo.workers} workers, the plan {plan.workers}")
    check_supported(plan, decision)
    if decision.shaper != "tc":
        return []
    out = topology_commands(topo)
    if not plan.shaped:
        return out
    for k in range(plan.workers):
        out += egress_commands(plan, topo, k) + ingress_commands(plan, topo, k)
        if decision.delay == "netem":
            out += delay_commands(plan, topo, k)
    return out
