"""Where the launcher meets the network: which address each worker binds, how it is started
(loopback, namespaces with tc, a host's NIC), and the user namespace it may need. The shaping
itself lives in the netem package.
"""
from __future__ import annotations

from contextlib import contextmanager

from gasloc_emu.config import Config
from gasloc_emu.netplan import multi_host_decision, shaped, shaping_decision
from netem import shapers


class LoopbackNetwork:
    """Unshaped: every worker binds an ephemeral port on 127.0.0.1 and starts as it is."""

    kind = shapers.unshaped()
    unshaped_start = False   # whether links start unshaped under a shaper (ScenarioNetwork)
    worker_nice = 0          # no packet line here to yield the CPU to

    @property
    def shaper(self) -> str:
        """The shaper's name, for the record, the dashboard and the logs."""
        return self.kind.name

    def __init__(self, cfg: Config, reason: str = "no bandwidth profile"):
        self.cfg, self.reason = cfg, reason

    def change_links(self, changes: dict) -> None:
        """Nothing shapes here: a partition's cuts (and their restores to unshaped) are the
        algorithms' absent edges, and link events that change rates or latencies get
        ``ScenarioNetwork`` instead (``open_network``); anything else is an error."""
        shaping = {k: v for k, v in changes.items() if v[0] not in (None, 0.0) or v[1]}
        if shaping:
            raise RuntimeError(f"link changes {shaping} on an unshaped network")

    def watch_tcp(self) -> None:
        """Nothing to sample: the workers share the host's namespace (``ShapedNetwork``)."""

    def training_starts(self) -> None:
        """Nothing delays frames here (``ShapedNetwork.training_starts``)."""

    def tcp_now(self) -> dict:
        return {}

    def bind_address(self, rank: int) -> str:
        return "tcp://127.0.0.1:0"  # the worker reports the port it got

    def wrap(self, rank: int, argv: list[str]) -> list[str]:
        return argv

    def netns(self, rank: int) -> str | None:
        return None

    def shaping_spec(self) -> dict | None:
        return None

    def configured_mbit(self, src: int, dst: int) -> float | None:
        return None

    def dry_run_text(self) -> str:
        return f"# shaper: none ({self.reason}); nothing to create"

    def describe_summary(self) -> dict:
        return {"shaper": self.shaper, "shaper_reason": self.reason,
                "bw_profile": self.cfg.net.bw_profile}

    def links_record(self, link_bytes: list[dict]) -> dict:
        return {"shaper": self.shaper, "links": link_bytes}

class ScenarioNetwork(LoopbackNetwork):
    """No bandwidth profile, but a scenario whose link events change rates or latencies: the
    userspace shaper with every link unshaped at the start, so that a link changed to 5 Mbit/s
    runs at 5 Mbit/s from then on, as the simulator's link model has it. Each worker applies
    its own links' changes (``worker_process``)."""

    kind = shapers.for_link_events()
    unshaped_start = True   # nothing to probe before the first link event (launcher._probes)

    def __init__(self, cfg: Config):
        super().__init__(cfg, "no bandwidth profile; the scenario's link events need a shaper: "
                         "userspace (links unshaped until an event changes them)")

    def shaping_spec(self) -> dict | None:
        from netem.userspace import MAX_QUEUE_S
        n = self.cfg.workers
        links = [[s, d, None, 0.0] for s in range(n) for d in range(n) if s != d]
        return {"mode": "userspace", "workers": n, "links": links, "up_mbit": {},
                "max_queue_s": MAX_QUEUE_S}

    def change_links(self, changes: dict) -> None:
        """The workers apply them (the launcher has no tc here)."""

    def dry_run_text(self) -> str:
        return f"# shaper: {self.shaper} (scenario link events); nothing to create"

class ShapedNetwork:
    """A run over the netem package's network: tc in namespaces, or the userspace shaper."""

    unshaped_start = False

    def __init__(self, cfg: Config, session, time_scale: float = 1.0):
        self.cfg, self.session = cfg, session
        self.time_scale = time_scale   # the run's K: the played links are dilated by it
        self.kind = session.decision.shaper_kind
        self.shaper = self.kind.name
        self.probe_rows: list[dict] = []
        # what applies a scenario's link changes in the launcher; None: the workers do
        self._changer = self.kind.link_changer(session)
        self._tcp = None    # netem.tcpsample.TcpSampler, while training runs

    def training_starts(self) -> None:
        """Mark the packet line's stats (``since_mark``): the fidelity verdict judges the
        lateness and read lag of training's frames, not the pre-run probe's bulk flows."""
        if self.session.line is not None:
            self.session.line.mark()

    def watch_tcp(self) -> None:
        """Sample the senders' TCP in every worker namespace from now until the record is
        written (``links_record``); every ``net.tcp_sample_s`` seconds, off at 0. Only where
        each worker has a namespace: in one namespace the sockets' addresses would not say
        whose link they are."""
        s = self.session
        if not self.cfg.net.tcp_sample_s or s.topo is None or s.dry_run:
            return
        from netem.tcpsample import TcpSampler, run_ss
        ranks = list(range(s.plan.workers))
        self._tcp = TcpSampler(ranks, {s.address(r): r for r in ranks}, s.wrap, run_ss,
                               interval_s=self.cfg.net.tcp_sample_s)
        self._tcp.start()

    def tcp_now(self) -> dict:
        """Per link (src, dst): the senders' TCP as last sampled (RTT, cwnd, retransmits)."""
        return self._tcp.now() if self._tcp is not None else {}

    def _tcp_summary(self) -> dict | None:
        if self._tcp is None:
            return None
        self._tcp.stop()
        return self._tcp.summary()

    def change_links(self, changes: dict) -> None:
        """Apply a round's link changes {(src, dst): (rate_mbit, latency_ms)} where the shaper
        applies them in the launcher (``Shaper.link_changer``: tc's classes in place); where it
        has the workers apply them (the userspace shaper), nothing here."""
        if self._changer is not None and changes:
            self._changer(changes)

    def bind_address(self, rank: int) -> str:
        return self.session.bind_address(rank)

    def wrap(self, rank: int, argv: list[str]) -> list[str]:
        return self.session.wrap(rank, argv)

    @property
    def worker_nice(self) -> int:
        """How far below normal priority the workers run (the packet line could not be made
        real-time: they yield it the CPU); 0 otherwise."""
        return self.session.worker_nice

    def netns(self, rank: int) -> str | None:
        """The named network namespace worker ``rank`` lives in (None: the launcher's)."""
        return self.session.netns(rank)

    def shaping_spec(self) -> dict | None:
        return self.session.shaping_spec()

    def configured_mbit(self, src: int, dst: int) -> float | None:
        return self.session.plan.effective_rate_mbit(src, dst)

    def dry_run_text(self) -> str:
        return self.session.dry_run_text()

    def probe(self, pairs: list[tuple[int, int]], seconds_per_link: float) -> list[dict]:
        """Measure the links training will use; rows of configured vs measured."""
        from netem.probe import probe_links
        self.probe_rows = probe_links(self.session, pairs, seconds_per_link=seconds_per_link,
                                      time_scale=self.time_scale)
        return self.probe_rows

    def describe_summary(self) -> dict:
        d = self.session.decision
        return {"shaper": d.shaper, "shaper_reason": d.reason, "delay": d.delay,
                "delay_faithful_to_tcp": d.delay_mode.faithful_to_tcp,
                "netns_mode": self.session.mode, "bw_profile": self.cfg.net.bw_profile,
                "profile": self.session.plan.profile, "tcp": self.session.tcp_record()}

    def fidelity_now(self):
        """The fidelity verdict as the packet line's lateness so far makes it
        (``report.fidelity.judge``); None without a line. Each call is a control round-trip to
        the line process: the caller asks at most once a second."""
        line = self.session.packet_line_lateness()
        if line is None:
            return None
        from gasloc_emu.report import fidelity
        plan = self.session.plan
        links = [fidelity.LinkPlan(src, dst, plan.effective_rate_mbit(src, dst) or None,
                                   float(link.latency_ms or 0.0))
                 for (src, dst), link in sorted(plan.links.items())]
        return fidelity.judge(links, line=line, time_scale=self.time_scale)

    def links_record(self, link_bytes: list[dict]) -> dict:
        """Configured vs measured per directed link, with the bytes training moved on it."""
        plan, sent = self.session.plan, {(r["src"], r["dst"]): r for r in link_bytes}
        probed = {(r["src"], r["dst"]): r for r in self.probe_rows}
        rows = []
        for (src, dst), link in sorted(plan.links.items()):
            if (src, dst) not in sent and (src, dst) not in probed:
                continue
            moved = sent.get((src, dst), {})
            row = {"src": src, "dst": dst, "configured_mbit": plan.effective_rate_mbit(src, dst),
                   "configured_latency_ms": link.latency_ms, "bytes": moved.get("bytes", 0),
                   "raw_bytes": moved.get("raw_bytes", 0)}
            rows.append(row | {k: v for k, v in probed.get((src, dst), {}).items() if k not in row})
        tcp = self._tcp_summary()
        if tcp is not None:
            for row in rows:
                row["tcp_training"] = tcp["links"].get((row["src"], row["dst"]))
        out = {"shaper": self.shaper, "network": self.session.describe(include_commands=False),
               "links": rows}
        if tcp is not None:
            out["tcp_sampling"] = {k: tcp[k] for k in ("rounds", "interval_s", "error")}
        line = self.session.packet_line_stats()
        if line is not None:
            out["packet_line"] = line
        return out

class HostNetwork:
    """One node's side of a multi-node run: its workers bind the host's address (the one on the
    route to the master), and every directed link, within the host or across hosts, is shaped
    the same way on every node, decided once all nodes have said what they can (``decide``):

    - tc (``netem.hosttc``): where every node may change qdiscs (CAP_NET_ADMIN) and has htb and
      u32; one HTB class per directed link on the interface that routes to its destination,
      matched on destination address and port (each worker binds one port per sender);
    - userspace (``netem.userspace``): sender pacing and receiver release, no privileges. Release
      times are on each host's wall clock (``time.time``), so the hosts' clocks must agree to
      well under a link's latency (NTP does a few ms); skew moves latency, never rates.
    """

    def __init__(self, cfg: Config, link_plan, addr: str, local_workers: int,
                 plays_links: bool = False):
        self.cfg, self.addr, self.link_plan = cfg, addr, link_plan
        self.plays_links = plays_links  # the scenario changes links: tc is not taken
        self.plan = link_plan if shaped(cfg) else None
        self.tc_missing = _host_tc_missing() if self.plan is not None and \
            shapers.may_take_tc(cfg.net.shaper) else "not asked for"
        # one port per sender for each local worker, found free now; used only with tc, which
        # needs every node able to do it
        self.port_base = _free_port_block(addr, local_workers * cfg.workers) \
            if not self.tc_missing else 0
        self.decision = None
        self.bases: dict[int, tuple[str, int]] = {}
        self.host = shapers.HostPart()   # the shaper's part on this host (decide)
        self.spec = None

    def training_starts(self) -> None:
        """A host's packet line is its node agent's: its stats are not read across hosts."""

    def watch_tcp(self) -> None:
        """Not sampled across hosts yet: a node's workers share its namespace, so the sockets'
        addresses would not say whose link they are (``ShapedNetwork.watch_tcp``)."""

    def tcp_now(self) -> dict:
        return {}

    unshaped_start = False
    worker_nice = 0          # no packet line on a host of a multi-node run

    @property
    def kind(self) -> shapers.Shaper | None:
        return self.decision.shaper_kind if self.decision is not None else None

    @property
    def shaper(self) -> str:
        return self.decision.shaper if self.decision is not None else "undecided"

    @property
    def link_ports(self) -> bool:
        return self.host.ports_per_sender

    def decide(self, missing_by_node: dict[int, str], nodes: list[tuple[str, int, int]],
               local: list[int]) -> None:
        """The run's shaper from what every node can do (the same answer on every node), then
        this node's part of it. ``nodes``: (address, port base, workers) per node, in order."""
        self.decision = multi_host_decision(self.cfg, self.link_plan, missing_by_node,
                                            self.plays_links)
        rank = 0
        for addr, base, count in nodes:
            for i in range(count):
                self.bases[rank] = (addr, base + i * self.cfg.workers)
                rank += 1
        from netem.userspace import spec_for
        self.spec = spec_for(self.plan, self.decision) if self.plan is not None else None
        if self.plan is not None:
            self.host = self.kind.on_host(self.plan, local, self.bases, self.cfg.net.mtu)

    def __enter__(self) -> HostNetwork:
        self.host.start()
        return self

    @staticmethod
    def clear_leftovers(echo) -> list[str]:
        """Remove the tc roots that runs killed on this host left (their process gone): a
        node agent started again after a kill -9 finds its predecessor's (``gasloc-emu netem
        clean`` does the same by hand)."""
        from netem.hosttc import clean_host_leftovers
        return clean_host_leftovers(echo=echo)

    def __exit__(self, *exc) -> None:
        self.host.close()

    def change_links(self, changes: dict) -> None:
        """The shaper's part on this host applies a scenario's link changes, or leaves them to
        the workers (``HostPart.change_links``; host tc refuses them: ``multi_host_decision``
        does not take tc for such a scenario)."""
        self.host.change_links(changes)

    def bind_address(self, rank: int) -> str:
        addr, base = self.bases[rank]
        return f"tcp://{addr}:{base if self.link_ports else 0}"

    def wrap(self, rank: int, argv: list[str]) -> list[str]:
        return argv

    def netns(self, rank: int) -> str | None:
        return None

    def shaping_spec(self) -> dict | None:
        return self.spec

    def configured_mbit(self, src: int, dst: int) -> float | None:
        return self.plan.effective_rate_mbit(src, dst) if self.plan is not None else None

    def describe_summary(self) -> dict:
        out = {"shaper": self.shaper, "shaper_reason": self.decision.reason,
               "bw_profile": self.cfg.net.bw_profile, "tcp": host_tcp_record(self.plan)}
        if self.plan is not None:
            out |= {"delay": self.decision.delay, "profile": self.plan.profile,
                    "delay_faithful_to_tcp": self.decision.delay_mode.faithful_to_tcp}
        return out

    def links_record(self, link_bytes: list[dict]) -> dict:
        rows = [r | {"configured_mbit": self.configured_mbit(r["src"], r["dst"])}
                for r in link_bytes]
        out = {"shaper": self.shaper, "links": rows}
        built = self.host.describe()
        if built is not None:
            out["tc"] = built
        return out

def host_tcp_record(plan) -> dict:
    """This host's TCP as its workers' connections get it (they run in the host's namespace):
    what it has, and what the plan asked for that it does not (a host's TCP is its owner's, so
    it is read and compared, never changed)."""
    from netem.tcpsettings import effective, read_host
    host = read_host()
    out = {"host": host.as_dict(), "differs": []}
    if plan is not None:
        asked = {link.tcp for link in plan.links.values() if not link.tcp.is_default}
        for settings in sorted(asked, key=repr):
            got, want = effective(type(settings)(), host), effective(settings, host)
            out["differs"] += [{"setting": k, "asked": v, "host": got[k]}
                               for k, v in want.items() if got[k] != v]
    return out

def _host_tc_missing() -> str:
    """Why tc cannot shape this host's interfaces ("" when it can)."""
    from netem.capabilities import probe
    from netem.hosttc import has_net_admin
    if not has_net_admin():
        return "no CAP_NET_ADMIN here (not root)"
    return probe().tc_missing() or ""

def _free_port_block(addr: str, count: int, first: int = 30000, last: int = 60000) -> int:
    """The first port of ``count`` consecutive ports free on ``addr`` right now."""
    import socket
    for base in range(first, last - count, max(count, 1)):
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind((addr, port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    from netem.capabilities import CapabilityError
    raise CapabilityError(f"no {count} consecutive free ports on {addr} in [{first}, {last}]")

def enter_userns_if_needed(cfg: Config, argv: list[str], dry_run: bool) -> None:
    """Re-exec the launcher in its own user + network + mount namespace when tc will shape.

    Everything the run builds then lives in that namespace and vanishes with the launcher, even
    on kill -9. Where user namespaces do not work, root builds run-prefixed names instead
    (``gasloc-emu netem clean`` removes leftovers); otherwise the userspace shaper is used.
    """
    if dry_run or not shaped(cfg):
        return
    shaping_decision(cfg).shaper_kind.before_launch(argv)

@contextmanager
def open_network(cfg: Config, link_plan, world=None, dry_run: bool = False,
                 time_scale: float = 1.0):
    """The network of a run (``link_plan``, ``world``, ``time_scale``: the run plan's), undone
    on exit."""
    links = world.links if world is not None else None
    if not shaped(cfg):
        off = shapers.turned_off(cfg.net.shaper)
        if not off and world is not None and world.changes_links:
            yield ScenarioNetwork(cfg)
            return
        reason = "shaper = none" if off else "no bandwidth profile"
        yield LoopbackNetwork(cfg, reason)
        return
    from netem.namespaces import NetworkSession
    plan, decision = link_plan, shaping_decision(cfg)
    # tc sizes GSO packets for the slowest rate a scenario or trace will give a worker's links
    floor = links.slowest_mbit() if links is not None else {}
    with NetworkSession(plan, decision, dry_run=dry_run, gso_floor_mbit=floor, seed=cfg.seed,
                        delayed_later=links is not None and links.delays,
                        line_priority=cfg.net.line_priority) as session:
        yield ShapedNetwork(cfg, session, time_scale)
