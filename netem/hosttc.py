"""tc on a host's real interfaces, for multi-node runs: every directed link that leaves this host.

Across hosts there are no per-worker namespaces to hang a tree on: workers share the host's NIC
(and ``lo`` between workers of one host). So each directed link i -> j gets its own destination
port: worker j binds one data-plane port per sender (base_j + i; ``ZmqTransport(link_ports=
True)``), and the host of i puts one HTB class per link on the interface that routes to j (the
NIC for a remote j, ``lo`` for a local one), matched on j's address and that port. Each link
class has the ACK child and the L2 correction of ``netem.commands`` (prio 0 for small packets,
rate scaled by (mtu + 14) / (mtu - 52)). Traffic that matches no filter (ACKs of the reverse
direction, everything else the host sends) leaves unshaped through HTB's direct queue.

Ownership. A root qdisc the run did not add is never replaced: only the kernel's defaults
(noqueue, pfifo_fast, fq_codel, mq, fq with handle 0:) are, and deleting our root brings the
default back. Every root we add has the run's handle (``run_handle``), and a state file in
``state_dir()`` names the run, its pid, its network namespace and its devices, so that
``gasloc-emu netem clean`` removes what a killed run left (``clean_host_leftovers``).

Not done here: caps per worker (a worker's links may leave by different devices) and netem
delay (latency uses the receiver's release queue, as where the kernel has no netem); both are
refused or routed elsewhere by ``check_host_plan``. GSO is left as the host has it: an HTB class
releases a 64 KiB GSO packet whole, which makes slow links bursty at the 10 ms scale but keeps
their rate over a transfer.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from netem.capabilities import CapabilityError
from netem.commands import (
    ACK_MAX_IP_BYTES,
    CUT_LEAF_LIMIT_PKTS,
    LEAF_LIMIT_PKTS,
    Command,
    burst_args,
    check_rate_mbit,
    class_rates,
    htb_rate_bps,
    link_classid,
)
from netem.profiles import LinkPlan

DEFAULT_ROOTS = ("noqueue", "pfifo_fast", "fq_codel", "mq", "fq")  # the kernel's, handle 0:
COMMAND_TIMEOUT_S = 30.0
_CAP_NET_ADMIN = 12


@dataclass(frozen=True)
class HostLink:
    """One directed link leaving this host: from worker ``src`` to ``addr:port`` on ``dev``."""

    src: int
    dst: int
    addr: str
    port: int
    rate_mbit: float
    dev: str


def run_handle(run_id: str) -> int:
    """The major handle of the run's root qdiscs: 0x4000-0x7fff, from the run id (hex)."""
    return 0x4000 + int(run_id, 16) % 0x4000


def check_host_plan(plan: LinkPlan) -> None:
    """Refuse what host tc cannot do before anything exists."""
    if plan.has_caps("up") or plan.has_caps("down"):
        raise CapabilityError("per-worker up/down caps are not shaped with tc across hosts "
                              "(a worker's links leave by different devices); use "
                              "net.shaper = 'userspace'")
    for attr in ("jitter_ms", "loss_pct"):
        if plan.max_of(attr):
            raise CapabilityError(f"net.{attr} needs netem on the path, which multi-node tc does "
                                  f"not build; set net.{attr} = 0")


def host_links(plan: LinkPlan, local: list[int], bases: dict[int, tuple[str, int]],
               dev_of) -> list[HostLink]:
    """The links leaving this host: from each local worker to every other worker.

    ``bases``: rank -> (address, base port) of every worker; ``dev_of(addr)``: the interface
    that routes to ``addr`` from here."""
    out = []
    for src in local:
        for dst, (addr, base) in sorted(bases.items()):
            if dst != src and (src, dst) in plan.links:
                out.append(HostLink(src, dst, addr, base + src,
                                    plan.effective_rate_mbit(src, dst), dev_of(addr)))
    return out


def cmd(desc: str, *argv: object) -> Command:
    return Command(tuple(str(a) for a in argv), None, desc)


def setup_commands(links: list[HostLink], mtu: int, handle: int) -> list[Command]:
    """Per device: our HTB root, then per link its class, ACK and bulk children, leaves and
    filters on (destination address, destination port)."""
    out = []
    for dev in sorted({link.dev for link in links}):
        on_dev = [link for link in links if link.dev == dev]
        out.append(cmd(f"HTB root of this run on {dev}", "tc", "qdisc", "replace", "dev", dev,
                        "root", "handle", f"{handle:x}:", "htb"))
        for index, link in enumerate(on_dev):
            out += _link_commands(link, index, mtu, handle)
    return out


def _link_commands(link: HostLink, index: int, mtu: int, handle: int) -> list[Command]:
    minor, h = link_classid(index), f"{handle:x}"
    return [*link_classes(link, index, mtu, handle, link.rate_mbit),
            *_leaves(link, index, handle),
            _filter(link, 1, minor + 1, h, small=True),
            _filter(link, 2, minor + 2, h, small=False)]


def link_classes(link: HostLink, index: int, mtu: int, handle: int, rate_mbit: float,
                  verb: str = "add") -> list[Command]:
    """The link class at ``rate_mbit`` and its ACK (prio 0) and bulk (prio 1) children;
    ``change`` restates every option, as ``add`` gives them."""
    r = class_rates(htb_rate_bps(rate_mbit, mtu), None, 1)
    rate, ceil, ack, bulk = r.rate, r.ceil, r.ack_rate, r.bulk_rate
    minor, h = link_classid(index), f"{handle:x}"
    desc = f"link {link.src}->{link.dst} {rate_mbit:g} Mbit/s"

    def cls(parent: str, m: int, rate: int, what: str, prio=()) -> Command:
        return cmd(f"{desc}{what}", "tc", "class", verb, "dev", link.dev, "parent", parent,
                    "classid", f"{h}:{m:x}", "htb", "rate", f"{rate}bit", "ceil", f"{ceil}bit",
                    *prio, *burst_args(ceil, mtu))

    return [cls(f"{h}:", minor, rate, ""),
            cls(f"{h}:{minor:x}", minor + 1, ack, " small packets", ("prio", 0)),
            cls(f"{h}:{minor:x}", minor + 2, bulk, " bulk", ("prio", 1))]


def _leaves(link: HostLink, index: int, handle: int, verb: str = "add",
            limit_pkts: int = LEAF_LIMIT_PKTS, desc: str = "leaf queue") -> list[Command]:
    minor, h = link_classid(index), f"{handle:x}"
    return [cmd(desc, "tc", "qdisc", verb, "dev", link.dev, "parent", f"{h}:{m:x}", "handle",
                 f"{m:x}:", "pfifo", "limit", limit_pkts) for m in (minor + 1, minor + 2)]


def change_commands(links: list[HostLink], mtu: int, handle: int, src: int, dst: int, *,
                    rate_mbit: float) -> list[Command]:
    """Set src -> dst (set up by ``setup_commands`` from the same ``links``) to ``rate_mbit``
    in place: queued packets and filters stay.

    As in ``commands.LiveLinks``: rate 0 is a cut, which closes the link's two leaf queues
    (``commands.CUT_LEAF_LIMIT_PKTS``: every packet dropped) and leaves its classes alone; any
    other rate is a ``tc class change`` of the three classes plus the leaves' limit restated,
    which reopens a cut link (so nothing here needs to remember cuts). Latency is not here:
    across hosts it is always the receiver's release queue (``LinkShaper.set_rx_link``)."""
    rate = check_rate_mbit(f"link {src}->{dst} rate_mbit", rate_mbit)
    link = next((lk for lk in links if (lk.src, lk.dst) == (src, dst)), None)
    if link is None:
        raise ValueError(f"link {src}->{dst} does not leave this host; its links: "
                         f"{', '.join(f'{lk.src}->{lk.dst}' for lk in links) or 'none'}")
    index = [lk for lk in links if lk.dev == link.dev].index(link)
    if rate == 0:
        return _leaves(link, index, handle, "change", CUT_LEAF_LIMIT_PKTS, f"cut {src}->{dst}")
    return (link_classes(link, index, mtu, handle, rate, verb="change")
            + _leaves(link, index, handle, "change", LEAF_LIMIT_PKTS, f"open {src}->{dst}"))


def _filter(link: HostLink, prio: int, minor: int, h: str, small: bool) -> Command:
    # IP total length (bytes 2-3 of the header) < 128 <=> its top nine bits are zero
    size = (["match", "u16", "0x0000", f"0x{0xffff & ~(ACK_MAX_IP_BYTES - 1):04x}", "at", "2"]
            if small else [])
    return cmd(f"classify {'small packets' if small else 'bulk'} to {link.addr}:{link.port}",
                "tc", "filter", "add", "dev", link.dev, "parent", f"{h}:", "protocol", "ip",
                "prio", prio, "u32", "match", "ip", "dst", f"{link.addr}/32", "match", "ip",
                "dport", link.port, "0xffff", *size, "flowid", f"{h}:{minor:x}")


def teardown_commands(devs: list[str]) -> list[Command]:
    return [cmd(f"remove this run's root on {dev}", "tc", "qdisc", "del", "dev", dev, "root")
            for dev in devs]


# ---------------------------------------------------------------- what the host has

def has_net_admin(status: str | None = None) -> bool:
    """Whether this process may change qdiscs here (CAP_NET_ADMIN in its effective set)."""
    if status is None:
        status = Path("/proc/self/status").read_text()
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status, re.M)
    return m is not None and bool(int(m.group(1), 16) >> _CAP_NET_ADMIN & 1)


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CapabilityError(f"`{' '.join(argv)}`: {exc}") from None


def route_dev(addr: str) -> str:
    """The interface this host sends to ``addr`` by (``lo`` for its own addresses)."""
    proc = _run(["ip", "-o", "route", "get", addr])
    m = re.search(r"\bdev (\S+)", proc.stdout)
    if proc.returncode != 0 or m is None:
        raise CapabilityError(f"no route to {addr}: {proc.stderr.strip() or proc.stdout.strip()}")
    return m.group(1)


def root_qdisc(dev: str) -> tuple[str, str]:
    """(kind, handle) of ``dev``'s root qdisc, e.g. ("noqueue", "0:")."""
    proc = _run(["tc", "qdisc", "show", "dev", dev, "root"])
    m = re.match(r"qdisc (\S+) (\S+)", proc.stdout.strip())
    if proc.returncode != 0 or m is None:
        raise CapabilityError(f"cannot read the root qdisc of {dev}: {proc.stderr.strip()}")
    return m.group(1), m.group(2)


def check_replaceable(dev: str) -> None:
    kind, handle = root_qdisc(dev)
    if kind not in DEFAULT_ROOTS or handle != "0:":
        raise CapabilityError(f"{dev} already has a root qdisc ({kind} {handle}) that this run "
                              "did not add; gasloc-emu will not replace it (remove it, or use "
                              "net.shaper = 'userspace')")


# ---------------------------------------------------------------- state, for clean

def state_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"gasloc-emu-{os.getuid()}"


def netns_id() -> int:
    """This process's network namespace (its inode): device names mean something only in it."""
    return os.stat("/proc/self/ns/net").st_ino


class HostShaping:
    """The run's tc on this host: built on ``start``, removed on ``close`` (every exit path)."""

    def __init__(self, run_id: str, links: list[HostLink], mtu: int):
        self.run_id, self.links, self.mtu = run_id, links, mtu
        self.handle = run_handle(run_id)
        self.devs = sorted({link.dev for link in links})
        self.commands = setup_commands(links, mtu, self.handle)
        self.state = state_dir() / f"hosttc-{run_id}.json"
        self.added: list[str] = []

    def start(self) -> None:
        from netem.namespaces import run_commands
        for dev in self.devs:
            check_replaceable(dev)
        self.state.parent.mkdir(mode=0o700, exist_ok=True)
        self.state.write_text(json.dumps({"run_id": self.run_id, "pid": os.getpid(),
                                          "netns": netns_id(), "handle": self.handle,
                                          "devs": self.devs}))
        try:
            run_commands(self.commands, done=self._done)
        except BaseException:
            self.close()
            raise

    def change_commands(self, src: int, dst: int, rate_mbit: float) -> list[Command]:
        """The commands that set src -> dst to ``rate_mbit`` (0: cut) from now on; run them with
        ``netem.namespaces.run_commands``."""
        return change_commands(self.links, self.mtu, self.handle, src, dst, rate_mbit=rate_mbit)

    def _done(self, cmd: Command) -> None:
        if cmd.argv[1:3] == ("qdisc", "replace"):
            self.added.append(cmd.argv[4])

    def close(self) -> None:
        remove_roots(self.added, self.handle)
        self.added = []
        self.state.unlink(missing_ok=True)

    def describe(self) -> dict:
        return {"handle": f"{self.handle:x}:", "devices": self.devs,
                "links": [link.__dict__ for link in self.links],
                "commands": [str(c) for c in self.commands]}


def remove_roots(devs: list[str], handle: int) -> list[str]:
    """Delete our root (and only ours: its handle is checked first) on each device."""
    done = []
    for dev in devs:
        with contextlib.suppress(CapabilityError):
            if root_qdisc(dev) == ("htb", f"{handle:x}:"):
                _run(["tc", "qdisc", "del", "dev", dev, "root"])
                done.append(f"tc qdisc del dev {dev} root")
    return done


def clean_host_leftovers(dry_run: bool = False, echo=print) -> list[str]:
    """Roots left on this namespace's devices by multi-node runs whose process is gone."""
    done = []
    for path in sorted(state_dir().glob("hosttc-*.json")) if state_dir().is_dir() else []:
        try:
            state = json.loads(path.read_text())
            pid, ns, devs, handle = state["pid"], state["netns"], state["devs"], state["handle"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if ns != netns_id() or Path(f"/proc/{pid}").exists():
            continue  # another namespace's devices, or a run still going
        for dev in devs:
            echo(f"tc qdisc del dev {dev} root  # left by run {state.get('run_id')}")
        if not dry_run:
            done += remove_roots(devs, handle)
            path.unlink(missing_ok=True)
        else:
            done += [f"tc qdisc del dev {dev} root" for dev in devs]
    return done
