"""The run's network, decided before anything runs: the link plan checked against what this host
can shape, tc or the userspace shaper (on one host or agreed by every node), the pairs that
carry traffic, and the simulator's link model over the same plan.

Time dilation: a network and machine the host cannot carry, emulated K times slower (Gupta
et al., "To Infinity and Beyond: Time-Warped Network Emulation", NSDI 2006).

With ``run.time_scale`` = K > 1 the run is played K times slower than asked: every link's
rate / K and every delay x K, so the host carries K times fewer bytes a second while every
bandwidth-delay product (rate x RTT: bytes in flight, the queue in packets, TCP's window in
segments) and every compute-to-communication ratio stays what was asked. Whatever the
workers measure is divided by K: records, the dashboard and ``compare`` see the asked run's
(emulated) time.

The rule, for every time of a run: **the wall clock is dilated, every time the run reports
is emulated** (emulated = wall / K).

- Dilated (x K in wall time), what the host and the emulator's machinery play out: the link
  plan the shaper applies (``dilate_link_plan``: rate / K, latency and jitter x K, caps / K,
  the loss and queue in packets kept), a scenario's link changes as the userspace shaper gets
  them and as the launcher's conductor hands them to tc (``dilate_state``), TCP's minimum
  RTO (the route's rto_min, K x 200 ms; the only TCP timer the kernel lets a namespace
  stretch, docs/NETWORK.md "Time dilation"), and every
  sleep of a worker (``WorkerClock.sleep``: a nominal step's pacing, a scenario's pause, the
  failure-detect wait). Scenario, link-trace and fault times and the round budget stay in
  the config's (emulated) seconds and are compared with the emulated clock, so they fall K
  times later in wall time (the conductor reads its clock / K and waits K times the emulated
  distance to its next event); the launcher's silence threshold for a training worker or a
  node, run.heartbeat_timeout_s x K (``Supervisor.silence_s``), as a worker's failure-detect
  wait is; a peer's backstop timeout (``peer_timeout_s``: its floor x K, the slowest
  message at the played rates).
- Emulated (/ K), what a worker measures and reports (``WorkerClock``): compute_s, comm_s,
  wait_s, the link observations (transfer_s, sent_s), the row's time_s, A2CiD2's step and
  exchange spans and its time unit, and the run clock a timed event is due by.
- Neither (wall seconds, machinery, not the emulated run): the heartbeat period, the
  workers' ready timeout, TCP sampling intervals, and a node agent's own wait for the launcher
  (multi-host: not dilated, so a node agent gives up on a silent launcher K times sooner in
  emulated time).

What the kernel keeps in wall time whatever K is (delayed-ACK timer, HyStart's thresholds,
cubic's C, BBR's windows, the initial and maximum RTO) is K times shorter on the emulated
clock; ``netem.tcpmodel.TcpParams.seen_at`` is the model of that, which ``simulate`` uses
so that it predicts what the dilated emulator sees.

The capacity measurement is ``netem.capacity``'s; the rest of time dilation is pure: the
RunPlan derives the dilated link plan and its clock from the functions here once.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from gasloc_emu import plugins
from gasloc_emu.config import Config, ConfigError


def multi_host_decision(cfg: Config, link_plan, missing_by_node: dict[int, str] | None = None,
                        plays_links: bool = False):
    """The decision of a multi-node run from what each node lacks for tc ("" = nothing).

    ``auto`` takes tc when every node can, else the userspace shaper (naming the node that
    cannot); ``tc`` with a node that cannot is refused on every node before anything starts.
    ``plays_links``: the scenario changes links during the run, which host tc does not apply
    yet: ``auto`` takes the userspace shaper, ``tc`` is refused, before anything starts.
    """
    from netem import shapers
    from netem.capabilities import CapabilityError, Decision
    if not shaped(cfg):
        why = "shaper = none" if shapers.turned_off(cfg.net.shaper) else "no bandwidth profile"
        return Decision("none", "none", why)
    _check_multi_host_delay(cfg)
    lacking = {k: why for k, why in (missing_by_node or {}).items() if why}
    if plays_links:
        lacking = {-1: "the scenario changes links during the run (link events, a trace or a "
                       "partition), which host tc does not apply yet"}
    k, missing = min(lacking.items()) if lacking else (0, "")
    try:
        kind, why = shapers.resolve(cfg.net.shaper, missing,
                                    "across hosts" if k < 0 else f"on node {k}")
    except shapers.ShaperError as exc:
        raise CapabilityError(str(exc)) from None
    return kind.decide_across_hosts(link_plan, why, shapers.asked(cfg.net.shaper) is None)

def _check_multi_host_delay(cfg: Config) -> None:
    """Across hosts the latency is held by the receivers (the release queue) whatever shaper
    the hosts get: an explicit delay mode that acts on packets would be silently not applied,
    so it is refused, naming the value and what is allowed."""
    from netem import delay as delay_modes
    requested = getattr(cfg.net, "delay", "auto")
    if requested == "auto":
        return
    if not delay_modes.mode(requested).across_hosts:
        allowed = [n for n in delay_modes.REQUESTS
                   if n == "auto" or delay_modes.mode(n).across_hosts]
        raise delay_modes.DelayModeError(
            f"net.delay = {requested!r} is not possible across hosts: a multi-node run holds "
            f"the latency at the receivers (release queue); expected one of {allowed}")

def used_pairs(cfg: Config, topo) -> list[tuple[int, int]]:
    """Directed links training will use: ring successors for DiLoCo, graph edges otherwise."""
    n = cfg.workers
    if topo is None:
        return sorted({(k, (k + 1) % n) for k in range(n) if n > 1})
    edges = topo.possible_edges
    return sorted({(a, b) for a, b in edges} | {(b, a) for a, b in edges})

def shaping_decision(cfg: Config):
    """The shaper decision for a shaped run; raises before anything is created."""
    from netem.capabilities import choose_shaper, probe
    return choose_shaper(cfg.net.shaper, probe(), delay=cfg.net.delay)

def shaped(cfg: Config) -> bool:
    from netem.shapers import turned_off
    return bool(cfg.net.bw_profile) and not turned_off(cfg.net.shaper)

# the network settings a run without a shaper would record but never apply
UNAPPLIED_WITHOUT_SHAPER = ("bw_profile", "latency_ms", "jitter_ms", "loss_pct", "reorder_pct",
                            "ge_p_pct")

def check_network(cfg: Config):
    """The bandwidth profile's link plan (the run plan builds it here, once), refusing network
    settings that would be recorded but not applied.

    The profile is built (so a broken profile file fails) whether or not a shaper will run;
    a profile, latency, jitter or loss with ``net.shaper = none`` is an error, since the run
    record would state a network the workers never saw.
    """
    from netem.profiles import ProfileError, build_link_plan
    from netem.shapers import turned_off
    if turned_off(cfg.net.shaper):
        # checked before the plan, whose own checks (jitter within latency, ...) would
        # otherwise name a smaller fault of settings that cannot apply at all
        given = [f"net.{k} = {getattr(cfg.net, k)!r}" for k in UNAPPLIED_WITHOUT_SHAPER
                 if getattr(cfg.net, k)]
        if given:
            raise ProfileError(f"{', '.join(given)} with net.shaper = 'none' would not be "
                               "applied; drop it, or choose a shaper (auto, tc or userspace)")
    return build_link_plan(cfg.net, cfg.workers, cfg.seed, tcp=cfg.tcp,
                           builder=profile_builder(cfg.net.bw_profile))


PROFILE_GROUP = "gasloc_emu.profiles"


def profile_builder(name: str):
    """The pair-rate builder of a profile that is none of netem's (``netem.profiles``' named
    profiles, a file, or unshaped: None): a function registered under the entry-point group
    ``gasloc_emu.profiles``, or ``package.module:function`` (docs/EXTENDING.md, "A bandwidth
    profile"). A name that is neither is one ``ProfileError`` line listing what is known."""
    from netem.profiles import NAMED, ProfileError, is_file_profile
    if not name or name in NAMED or is_file_profile(name):
        return None
    if not plugins.is_path(name) and name not in plugins.registered(PROFILE_GROUP):
        known = ", ".join([*NAMED, *sorted(plugins.registered(PROFILE_GROUP))])
        raise ProfileError(f"net.bw_profile = {name!r} is not a profile; expected one of "
                           f"{known}, a path to a .toml or .json file, or "
                           "package.module:function")
    try:
        builder = plugins.load(name, PROFILE_GROUP, "net.bw_profile")
    except plugins.PluginError as exc:
        raise ProfileError(str(exc)) from None
    if not callable(builder) or isinstance(builder, type):
        raise ProfileError(f"net.bw_profile = {name!r} is {builder!r}, not a function "
                           "(net, workers, seed) -> (rates, note)")
    return builder

def sim_link_model(cfg: Config, link_plan, world=None, host=None, time_scale: float = 1.0):
    """The simulator's link model from the bandwidth profile, or None when unshaped.

    Unshaped means what it means for ``run``: no profile, or ``net.shaper = none``; the virtual
    clock then predicts nothing, as the emulator then shapes nothing. A scenario whose link
    events change rates or latencies gets a ``RoundLinkModel`` even without a profile (``run``
    then shapes with the userspace shaper, see ``open_network``). ``world``: the run's, when
    it has one).

    Where TCP sees the latency (``tcp_sees_latency``: netem or the packet line) and some link
    has a latency or loss, the model is a ``TcpLinkModel`` over the same plain model: each
    directed link's message times follow its sender's TCP (``netem.tcpmodel``), with the
    host's TCP (``host``: a ``tcpsettings.HostTcp``; None reads
    ``tcpsettings.read_original_host()``) under the links' settings. Under the release queue,
    or without latency and loss anywhere, the plain model stays, bit for bit.

    ``time_scale`` (the plan's K): the model times the asked links on the emulated clock,
    with the TCP the dilated run has (``TcpLinkModel.for_plan``); the plain arithmetic is
    the same at every K (bytes / (rate / K) / K).
    """
    if world is not None and world.changes_links:
        base = RoundLinkModel(world.links, link_caps(cfg, link_plan))
        delays_later = bool(getattr(world.links, "delays", True))
        if (delays_later or _tcp_limited(link_plan)) and tcp_sees_latency(cfg):
            return TcpLinkModel.for_plan(link_plan, cfg, base=base, path_at=base.path_at,
                                         host=host, time_scale=time_scale)
        return base
    if not shaped(cfg):
        return None
    if _tcp_limited(link_plan) and tcp_sees_latency(cfg):   # the plan first: no probe
        return TcpLinkModel.for_plan(link_plan, cfg, host=host, time_scale=time_scale)
    return link_plan.link_model()


def tcp_sees_latency(cfg) -> bool:
    """Whether the delay mode ``run`` would use puts the latency (and loss) before the senders'
    TCP (``netem.delay``: faithful to TCP and acting on packets: netem or the packet line), so
    that slow start, the restart after idle and the window a round trip needs cost what they
    cost over a wide-area link. The release queue (and the userspace shaper, which has only
    that) holds messages after TCP delivered them: TCP never sees the delay.

    An explicit ``net.delay`` is taken as asked (``run`` uses it or refuses to start); ``auto``
    is what this host's probe gives (``shaping_decision``), and False where no shaper decision
    is possible here (``run`` would refuse too). A config without ``net.delay`` (an older
    record's) is today's model: False."""
    from netem import delay as delay_modes
    from netem import shapers
    from netem.capabilities import CapabilityError
    delay = getattr(cfg.net, "delay", None)
    if delay is None or not shaped(cfg):
        return False
    kind = shapers.asked(cfg.net.shaper)
    if delay != "auto" and (kind is None or kind.carries(delay)):
        m = delay_modes.mode(delay)
        return m.faithful_to_tcp and m.on_packets
    try:
        decision = shaping_decision(cfg)
    except (CapabilityError, delay_modes.DelayModeError):
        return False
    m = decision.delay_mode
    return m.faithful_to_tcp and m.on_packets


def _tcp_limited(link_plan) -> bool:
    """Whether any link has what makes TCP cost more than bytes / rate + latency: loss, or a
    bandwidth-delay product beyond the window slow start has after its first round trip
    (2 x the initial window). Below that a message, even after an idle restart, loses at most
    one round's gap of under init_cwnd segments' time to TCP (8 Mbit/s over 20 ms: 5 ms), and
    the plain model is kept, bit for bit, as it is without latency (the model's zero-RTT case
    is the plain arithmetic exactly)."""
    from netem.tcpmodel import DEFAULT_INIT_CWND, TCPIP_HEADER_BYTES
    mss = link_plan.mtu - TCPIP_HEADER_BYTES
    for src, dst in link_plan.link_classes():   # each kind of link and its reverse, once
        link = link_plan.links[(src, dst)]
        if link.lossy:
            return True
        back = link_plan.links.get((dst, src))
        rtt_s = (link.latency_ms + (back.latency_ms if back is not None else link.latency_ms)) / 1e3
        bdp_segs = link_plan.effective_rate_mbit(src, dst) * 1e6 * rtt_s / 8 / mss
        if bdp_segs > 2 * (link.tcp.init_cwnd or DEFAULT_INIT_CWND):
            return True
    return False


def link_caps(cfg: Config, link_plan):
    """(src, dst) -> (src's uplink cap, dst's downlink cap) in Mbit/s, None for none."""
    if not shaped(cfg):
        return lambda src, dst: (None, None)
    return lambda src, dst: (link_plan.cap(src).up_mbit, link_plan.cap(dst).down_mbit)

PLAIN_MODEL = "bytes / rate + latency per message (caps on top)"


def describe_link_model(model) -> str:
    """One line for how ``simulate`` times messages under ``model`` (a ``sim_link_model``)."""
    if model is None:
        return "none: unshaped, simulate predicts no network time"
    describe = getattr(model, "describe", None)
    return describe() if describe is not None else PLAIN_MODEL


class LinkCut(RuntimeError):
    """A message was offered to a link a partition cuts: the algorithms must not send there."""

class RoundLinkModel:
    """The virtual clock's link model when a scenario (or a link trace) changes links: each
    message gets the (rate, latency) in force for the round in its key and the virtual time it
    is sent at (``at_round``; ``world.LinkSchedule.at``), with the profile's caps on top, as
    ``LinkPlan.link_model`` has them (one flow with a cap to itself). An unshaped link takes
    no time; a cut link refuses the message (``LinkCut``)."""

    def __init__(self, schedule, caps):
        self.schedule, self.caps = schedule, caps

    @staticmethod
    def describe() -> str:
        return ("per round: bytes / the rate in force + the latency in force (the scenario's "
                "link events and trace), caps on top")

    def __call__(self, src: int, dst: int, nbytes: int) -> tuple[float, float]:
        return self.at_round(src, dst, nbytes, 0)

    def at_round(self, src: int, dst: int, nbytes: int, round_idx: int,
                 now_s: float = 0.0) -> tuple[float, float]:
        rate, latency_s = self.path_at(src, dst, round_idx, now_s)
        wire_s = nbytes * 8 / (rate * 1e6) if rate is not None else 0.0
        return wire_s, latency_s

    def path_at(self, src: int, dst: int, round_idx: int,
                now_s: float = 0.0) -> tuple[float | None, float]:
        """(the rate in Mbit/s a flow gets, caps included, None when unshaped; the one-way
        latency in s) in force for round ``round_idx`` at ``now_s``; LinkCut when cut."""
        rate, latency_ms = self.schedule.at(src, dst, round_idx, now_s)
        if rate == 0.0:
            raise LinkCut(f"a message of round {round_idx} from worker {src} to worker {dst}: "
                          "a partition cuts that link in that round")
        rates = [r for r in (rate, *self.caps(src, dst)) if r is not None]
        return (min(rates) if rates else None), latency_ms / 1e3


class _HostTcp:
    """The host's TCP settings, read once, when a link is first timed (``read``), or the ones
    given; an object rather than a cached closure, so a plan holding it can be handed to the
    workers serialised."""

    def __init__(self, read, host=None):
        self._read, self._host = read, host

    def __call__(self):
        if self._host is None:
            self._host = self._read()
        return self._host


class TcpLinkModel:
    """The virtual clock's link model where TCP sees the latency: one ``tcpmodel``
    connection per directed link (src, dst), its window kept from message to message, so a
    message after idle pays the restart, a first one slow start, a lossy link its response
    function (``netem.tcpmodel``'s docstring has the rules and the kernel source they follow).

    It composes, never copies, the plain arithmetic: ``base`` is the plain model (the plan's
    ``link_model()`` or a scenario's ``RoundLinkModel``), and its stateless calls (``__call__``,
    ``at_round``) are base's own, bit for bit. ``transfer`` is the TCP one, for a caller that
    knows when each message starts (the virtual clock: the start of a message is when the
    connection's idle time ends). ``path_at(src, dst, round_idx, now_s)`` gives the rate
    (Mbit/s, None: unshaped) and the one-way latency (s) in force; the round-trip time of
    src -> dst is its latency plus dst -> src's (the ACKs come back over the reverse link).
    ``params_of(src, dst)``: the sender's ``TcpParams`` on that link. ``streams``: parallel
    connections striping each message (``TcpConnection``'s ``streams``).

    A link without round-trip time and loss (or unshaped) gets base's answer: over it TCP
    costs the bytes at the rate. Jitter is left out (a mean of zero; its effect on the RTO
    and reordering is not modelled)."""

    def __init__(self, base, path_at, params_of, streams: int = 1, fixed_paths: bool = False):
        """``fixed_paths``: ``path_at`` gives each link one path whatever the round and time
        (the plan's own): each link's path, round trip and connection are then found once."""
        if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= 1024:
            raise ValueError(f"streams = {streams!r} is out of range; expected an integer in "
                             "[1, 1024]")
        self.base, self.path_at, self.streams = base, path_at, streams
        self.fixed_paths = fixed_paths
        self._params_of = params_of
        self._params: dict[tuple[int, int], object] = {}
        self._conns: dict[tuple[int, int], object] = {}
        # each link's messages, (bytes, TransferTime) in the order they were timed: summed
        # when recorded (``record``), not per message
        self._log: dict[tuple[int, int], list] = {}
        self._fixed: dict[tuple[int, int], tuple] = {}   # fixed paths: (latency s, conn, log)
        self._memos: dict[tuple, dict] = {}   # (params, rate, RTT): the connections' memo

    def describe(self) -> str:
        base = getattr(self.base, "describe", None)
        over = base() if base is not None else PLAIN_MODEL
        return (f"TCP: each directed link's messages follow its sender's TCP ({self.streams} "
                f"stream{'s' if self.streams > 1 else ''}; slow start, restart after idle, "
                f"window, loss) over {over}")

    @classmethod
    def for_plan(cls, link_plan, cfg, base=None, path_at=None, host=None,
                 time_scale: float = 1.0) -> TcpLinkModel:
        """The model of a run's plan: each link's ``tcp`` (with ``cfg.tcp`` under it, read
        field by field so that an older config without some field still works) over the
        host's TCP, the plan's MTU, each link's mean loss and queue; ``cfg.comm.streams``
        (1 without it). ``base`` / ``path_at``: the plain model and its paths (the plan's).

        ``time_scale`` K > 1: ``link_plan`` is the asked one and times stay emulated, but
        each sender's TCP is the one the dilated run has (``TcpParams.seen_at``: rto_min
        scaled by the route, the kernel's fixed constants K times shorter, GSO packets sized
        for the dilated rate as tc sizes them), so simulate predicts what run sees at K."""
        from netem.tcpmodel import params_for
        from netem.tcpsettings import TcpSettings, read_original_host
        # the host's TCP is read when a link is first timed, not when the plan is built: a
        # worker process of ``run`` holds the plan too and never times a message by it
        host_tcp = _HostTcp(read_original_host, host)
        run = TcpSettings(**{k: getattr(getattr(cfg, "tcp", None), k, v) for k, v in
                             TcpSettings().as_dict().items()})

        made: dict[tuple, object] = {}

        def params_of(src: int, dst: int):
            from netem.commands import gso_segments
            link = link_plan.links[(src, dst)]
            # the sender's GSO packets, sized for its slowest link as tc sizes them (the plan
            # answers from its rule: one sender's N - 1 links are not walked per link)
            slowest = link_plan.slowest_rate_mbit(src)
            given = (link.tcp, min(link.mean_loss_pct(), 99.0), link.queue_pkts,
                     gso_segments(slowest / time_scale, link_plan.mtu))
            params = made.get(given)   # links alike share their (frozen) params
            if params is None:
                params = made[given] = params_for(
                    run.merged(given[0]), host_tcp(), mtu=link_plan.mtu, loss_pct=given[1],
                    queue_pkts=given[2], burst_segments=given[3]).seen_at(time_scale)
            return params

        paths: dict[tuple[int, int], tuple[float, float]] = {}

        def plan_path(src: int, dst: int, round_idx: int, now_s: float):
            if not link_plan.shaped:
                return None, 0.0
            path = paths.get((src, dst))   # a plan's links do not change: each found once
            if path is None:
                path = paths[(src, dst)] = (link_plan.effective_rate_mbit(src, dst),
                                            link_plan.links[(src, dst)].latency_ms / 1e3)
            return path
        streams = getattr(getattr(cfg, "comm", None), "streams", 1)
        return cls(link_plan.link_model() if base is None else base,
                   plan_path if path_at is None else path_at, params_of, streams,
                   fixed_paths=path_at is None)

    def fresh(self) -> TcpLinkModel:
        """The same links with no connection yet (each replay starts from new connections)."""
        return type(self)(self.base, self.path_at, self._params_of, self.streams,
                          self.fixed_paths)

    def params_of(self, src: int, dst: int):
        key = (src, dst)
        if key not in self._params:
            self._params[key] = self._params_of(src, dst)
        return self._params[key]

    # -- the plain protocol: base's own numbers

    def __call__(self, src: int, dst: int, nbytes: int) -> tuple[float, float]:
        return self.base(src, dst, nbytes)

    def at_round(self, src: int, dst: int, nbytes: int, round_idx: int,
                 now_s: float = 0.0) -> tuple[float, float]:
        at_round = getattr(self.base, "at_round", None)
        if at_round is not None:
            return at_round(src, dst, nbytes, round_idx, now_s)
        return self.base(src, dst, nbytes)

    # -- TCP

    def link_timer(self, src: int, dst: int) -> _TcpLink:
        """The timer of src -> dst's messages, ``timer(nbytes, start_s, round_idx)``: its
        ``transfer``, with a fixed path's connection found once (the virtual clock asks each
        link's timer once and keeps it)."""
        return _TcpLink(self, src, dst)

    def transfer(self, src: int, dst: int, nbytes: int, start_s: float,
                 round_idx: int = 0) -> tuple[float, float]:
        """(wire s, latency s) of a message offered at ``start_s`` (virtual time) on src ->
        dst: wire is until its last byte has left the sender's bottleneck (slow start, the
        restart after idle, window limits and retransmissions included), latency the one-way
        delay after that, as the plain protocol has them."""
        fixed = self._fixed.get((src, dst)) if self.fixed_paths else None
        if fixed is not None:     # the plan's link, its connection found before
            latency_s, conn, log = fixed
            tt = conn.transfer(nbytes, start_s)
            log.append((nbytes, tt))
            return tt.wire_s, latency_s
        rate, latency_s = self.path_at(src, dst, round_idx, start_s)
        try:
            _, back_s = self.path_at(dst, src, round_idx, start_s)
        except LinkCut:
            back_s = latency_s      # the ACKs' way is cut: take this direction's
        rtt_s = latency_s + back_s
        params = self.params_of(src, dst) if rate is not None else None
        if rate is None or (rtt_s == 0 and params.loss_pct == 0):
            return self.at_round(src, dst, nbytes, round_idx, start_s)
        conn = self._connection(src, dst, params, rate, rtt_s)
        log = self._log[(src, dst)]
        if self.fixed_paths:
            self._fixed[(src, dst)] = (latency_s, conn, log)
        tt = conn.transfer(nbytes, start_s)
        log.append((nbytes, tt))
        return tt.wire_s, latency_s

    def message_s(self, src: int, dst: int, nbytes: int, idle_s: float = 1.0,
                  messages: int = 3) -> float:
        """What a message of ``nbytes`` takes on src -> dst (wire and latency: from its offer
        to its last byte's arrival, as a receiver times it), each offered ``idle_s`` after the
        previous one arrived on one fresh connection; the mean after the first (the first
        pays the initial window where later ones pay the restart after idle, or not). What
        the run's fidelity verdict holds the run's own message times to."""
        model, t_s, times = self.fresh(), 0.0, []
        for _ in range(messages):
            wire_s, latency_s = model.transfer(src, dst, nbytes, t_s)
            times.append(wire_s + latency_s)
            t_s += wire_s + latency_s + idle_s
        later = times[1:] or times
        return sum(later) / len(later)

    @staticmethod
    def _stats(log: list) -> dict:
        """A link's messages (``log``: (bytes, ``TransferTime``) in the order they were
        timed) counted and their times summed, in that order."""
        st = {"messages": 0, "bytes": 0, "restarts": 0, "total_s": 0.0,
              "serialisation_s": 0.0, "propagation_s": 0.0, "window_s": 0.0,
              "retransmit_s": 0.0}
        for nbytes, tt in log:
            st["messages"] += 1
            st["bytes"] += nbytes
            st["restarts"] += tt.restarted
            st["total_s"] += tt.total_s
            st["serialisation_s"] += tt.serialisation_s
            st["propagation_s"] += tt.propagation_s
            st["window_s"] += tt.window_s
            st["retransmit_s"] += tt.retransmit_s
        return st

    def _connection(self, src: int, dst: int, params, rate: float, rtt_s: float):
        from netem.tcpmodel import TcpConnection
        key = (src, dst)
        conn = self._conns.get(key)
        if conn is None:
            # links alike (params, rate, RTT) share their memo of messages: a link's first
            # messages (slow start) are another's
            memo = self._memos.setdefault((params, rate, rtt_s), {})
            conn = self._conns[key] = TcpConnection(params, rate, rtt_s, self.streams, memo)
            self._log[key] = []
        elif conn.path != (rate, rtt_s):
            conn.set_path(rate, rtt_s)      # a scenario changed the link: the window stays
        return conn

    def record(self) -> dict:
        """Per directed link that carried a message under the model: its TCP and what its
        messages' times were made of (seconds summed over the messages)."""
        out = {}
        for (src, dst), log in sorted(self._log.items()):
            p = self.params_of(src, dst)
            rate, rtt_s = self._conns[(src, dst)].path
            out[f"{src}->{dst}"] = self._stats(log) | {
                "congestion_control": p.congestion_control,
                "slow_start_after_idle": p.slow_start_after_idle,
                "init_cwnd_segments": p.init_cwnd_segments, "loss_pct": p.loss_pct,
                "rate_mbit": rate, "rtt_ms": rtt_s * 1e3, "streams": self.streams}
        return out


class _TcpLink:
    """One directed link's ``TcpLinkModel.transfer``: the first message goes the whole way
    (finds the path, makes the connection); on a fixed path (the plan's own) the next ones
    go straight to its connection."""

    __slots__ = ("model", "src", "dst", "conn", "latency_s", "log")

    def __init__(self, model: TcpLinkModel, src: int, dst: int):
        self.model, self.src, self.dst, self.conn = model, src, dst, None

    def __call__(self, nbytes: int, start_s: float, round_idx: int) -> tuple[float, float]:
        conn = self.conn
        if conn is None:
            timed = self.model.transfer(self.src, self.dst, nbytes, start_s, round_idx)
            fixed = self.model._fixed.get((self.src, self.dst))
            if fixed is not None:
                self.latency_s, self.conn, self.log = fixed
            return timed
        tt = conn.transfer(nbytes, start_s)
        self.log.append((nbytes, tt))
        return tt.wire_s, self.latency_s


def placement_regions(placement: str) -> tuple[str, ...]:
    """The region of each worker of a placement (a preset or ``region[*count],...``); () for
    none."""
    from netem.cloud import parse_placement
    return parse_placement(placement) if placement else ()


def link_rates(link_plan):
    """rates[i, j]: what one flow i -> j can get (the link, capped by i's uplink and j's
    downlink) in Mbit/s, 0 on the diagonal, as an N x N float64 array (``LinkPlan.
    rate_matrix``: from the profile's rule where it has one); None when unshaped. What the
    ``fastest`` graph chooses peers by and every graph's bottleneck is measured with."""
    if link_plan is None or not link_plan.shaped:
        return None
    return link_plan.rate_matrix()


# ---------------------------------------------------------------- time dilation

TIME_SCALE_RANGE = (1.0, 1000.0)   # config.ExecConfig.time_scale's bounds
AUTO_MARGIN = 0.5       # auto: the plan's peak frame rate at most this share of the capacity
KERNEL_RTO_MIN_MS = 200.0          # include/net/tcp.h TCP_RTO_MIN


def check_time_scale(k) -> float:
    """K as a float in TIME_SCALE_RANGE; a ConfigError naming the value otherwise."""
    lo, hi = TIME_SCALE_RANGE
    ok = isinstance(k, (int, float)) and not isinstance(k, bool) and math.isfinite(k) \
        and lo <= k <= hi
    if not ok:
        raise ConfigError(f"run.time_scale = {k!r} is out of range; expected a number in "
                          f"[{lo:g}, {hi:g}] or 'auto'")
    return float(k)


# ---------------------------------------------------------------- the links

def dilate_link(link, k: float):
    """One ``netem.profiles.Link`` as the shaper plays it at K: rate / K, latency and jitter
    x K, the route's rto_min x K (the link's own, or the kernel's 200 ms); loss, reordering
    and the queue (in packets: a BDP in packets is the same at K) kept."""
    from netem.profiles import ProfileError
    if k == 1.0:
        return link
    tcp = link.tcp
    tcp = replace(tcp, rto_min_ms=(tcp.rto_min_ms or KERNEL_RTO_MIN_MS) * k)
    try:
        return replace(link, rate_mbit=link.rate_mbit / k, latency_ms=link.latency_ms * k,
                       jitter_ms=link.jitter_ms * k, tcp=tcp)
    except ProfileError as exc:   # a delay the shapers cannot hold (LATENCY_RANGE_MS)
        raise ConfigError(f"run.time_scale = {k:g} cannot be played on link {link.src}->"
                          f"{link.dst}: {exc}; use a smaller time scale") from None


def _dilate_fields(fields: dict, k: float) -> dict:
    """A ``BlockLinks`` block's Link fields (all but src, dst) at K, checked as a Link."""
    from netem.profiles import Link
    return {name: value for name, value in dilate_link(Link(0, 1, **fields), k).__dict__.items()
            if name not in ("src", "dst")}


def dilate_link_plan(plan, k: float):
    """The ``netem.profiles.LinkPlan`` the shaper applies at K (``dilate_link`` on every link,
    caps / K); the plan itself at K = 1 or unshaped. A rule's links (``BlockLinks``) stay a
    rule: their blocks and kinds are dilated, not the N(N-1) links."""
    from netem.profiles import BlockLinks, WorkerCaps
    if k == 1.0 or plan is None or not plan.shaped:
        return plan
    links = plan.links
    if isinstance(links, BlockLinks):
        links = BlockLinks(links.workers, links.group,
                           {key: _dilate_fields(f, k) for key, f in links.block.items()},
                           tuple(_dilate_fields(f, k) for f in links.kinds), links.exceptions)
    else:
        links = {key: dilate_link(link, k) for key, link in links.items()}
    caps = {rank: WorkerCaps(*(None if v is None else v / k for v in (c.up_mbit, c.down_mbit)))
            for rank, c in plan.caps.items()}
    return replace(plan, links=links, caps=caps, note=plan.note)


def dilate_state(rate_mbit: float | None, latency_ms: float, k: float
                 ) -> tuple[float | None, float]:
    """A scenario's link state (rate in Mbit/s, None unshaped, 0 cut; latency in ms) as the
    userspace shaper plays it at K."""
    if k == 1.0:
        return rate_mbit, latency_ms
    return (None if rate_mbit is None else rate_mbit / k), latency_ms * k


# ---------------------------------------------------------------- a worker's clock

@dataclass(frozen=True)
class WorkerClock:
    """A worker's clocks at K: what it measures, divided by K (emulated seconds), and what it
    sleeps, multiplied by K (``wall`` a perf_counter, ``epoch`` a time.time, ``wall_sleep`` a
    time.sleep: injected, so the rule is tested without waiting). At K = 1 every value is the
    wall clock's, to the bit (x / 1.0 == x)."""

    time_scale: float = 1.0
    wall: Callable[[], float] = time.perf_counter
    epoch: Callable[[], float] = time.time
    wall_sleep: Callable[[float], None] = time.sleep

    def now_s(self) -> float:
        """The emulated perf counter: differences of it are emulated seconds."""
        return self.wall() / self.time_scale

    def since_s(self, t0_epoch: float, at_epoch: float | None = None) -> float:
        """Emulated seconds from ``t0_epoch`` (a time.time value, the run's start) to now or
        to ``at_epoch`` (a time.time stamp)."""
        end = self.epoch() if at_epoch is None else at_epoch
        return (end - t0_epoch) / self.time_scale

    def emulated_s(self, wall_s: float) -> float:
        """A measured wall duration in emulated seconds."""
        return wall_s / self.time_scale

    def sleep(self, emulated_s: float) -> None:
        """Stand still for ``emulated_s`` of the emulated run: K times that in wall time."""
        self.wall_sleep(emulated_s * self.time_scale)


# ---------------------------------------------------------------- auto: the peak frame rate

TSO_MAX_BYTES = 65_536      # GSO_MAX_SIZE: a veth's TSO frame at most
TSO_MIN_SEGS = 2            # sysctl tcp_min_tso_segs
TSO_WINDOW_S = 1e-3         # sk_pacing_shift 10: about 1 ms of data at the pacing rate


def frame_bytes(rate_mbit: float, mss_bytes: int) -> float:
    """The size of the frames one TCP flow at ``rate_mbit`` sends (net/ipv4/tcp_output.c
    tcp_tso_autosize): about 1 ms of data at its pacing rate, at least tcp_min_tso_segs (2)
    segments, at most a 64 KiB GSO frame. The pacing rate is taken as the rate itself, not
    the 1.2-2 x of tcp_update_pacing_rate: smaller frames, more of them, a conservative
    count."""
    data = rate_mbit * 1e6 / 8 * TSO_WINDOW_S
    return min(max(data, TSO_MIN_SEGS * mss_bytes), float(TSO_MAX_BYTES))


def peak_frame_rate(flows: list[float], mss_bytes: int) -> float:
    """Frames a second the packet line must move when every flow of ``flows`` (each a rate
    in Mbit/s) sends at once: each flow's data frames, and as many ACK frames back (the
    receiver acknowledges every frame of two segments or more at least once: a GRO'd frame
    gets one ACK, two MTU segments one delayed ACK)."""
    return sum(2 * r * 1e6 / 8 / frame_bytes(r, mss_bytes) for r in flows)


def plan_flows(link_plan, pairs, streams: int = 1) -> list[float]:
    """The flows of one exchange, every used directed link at once (``pairs``), each link's
    ``streams`` connections at an equal share of its effective rate. A cap shared by a
    worker's flows is not divided among them: more frames, a conservative count."""
    out: list[float] = []
    for src, dst in pairs:
        rate = link_plan.effective_rate_mbit(src, dst)
        out += [rate / streams] * streams
    return out


@dataclass(frozen=True)
class AutoScale:
    """What ``run.time_scale = 'auto'`` decided, for the record (RunPlan.auto_scale):
    ``peak_fps`` the plan's peak frame rate at K = 1, ``peak_fps_at_k`` at the chosen K,
    ``capacity_fps`` what the packet line moved on this host (``capacity_source``: measured
    now or read from the host's cache, with its date), ``margin`` the share of the capacity
    the peak may take, ``time_scale`` the K chosen."""

    time_scale: float
    peak_fps: float
    peak_fps_at_k: float
    capacity_fps: float
    margin: float
    capacity_source: str

    def record(self) -> dict:
        return dict(self.__dict__)


def pick_time_scale(peak_at: Callable[[float], float], capacity_fps: float,
                    margin: float = AUTO_MARGIN) -> float:
    """The smallest whole K in [1, 1000] whose peak frame rate ``peak_at(K)`` is at most
    ``margin`` x ``capacity_fps``; a ConfigError naming both where none is. Whole numbers:
    every dilated time and the route's rto_min in ms stay exact where the asked ones are."""
    if not (capacity_fps > 0 and math.isfinite(capacity_fps)):
        raise ConfigError(f"run.time_scale = 'auto': the packet line's capacity "
                          f"{capacity_fps!r} frames/s is not a positive number")
    budget = margin * capacity_fps
    lo, hi = 1, int(TIME_SCALE_RANGE[1])
    if peak_at(float(hi)) > budget:
        raise ConfigError(f"run.time_scale = 'auto': even K = {hi} leaves a peak of "
                          f"{peak_at(float(hi)):.0f} frames/s, above {margin:.0%} of the "
                          f"{capacity_fps:.0f} frames/s the packet line moves here")
    while lo < hi:   # peak_at falls as K grows (rates / K, frames no larger)
        mid = (lo + hi) // 2
        if peak_at(float(mid)) <= budget:
            hi = mid
        else:
            lo = mid + 1
    return float(lo)


def resolve_time_scale(cfg: Config, link_plan, topo):
    """(K, the ``AutoScale`` behind it or None) from ``run.time_scale``: the number
    as given, or under 'auto' the smallest K whose peak frame rate (every used link sending
    at once, ``peak_frame_rate``) the packet line's capacity on this host
    (``netem.capacity.host_capacity``: measured, or cached per host) carries with the margin.
    'auto' where nothing can be measured is a ConfigError naming why (exit 2)."""
    asked = getattr(cfg.run, "time_scale", 1.0)   # an older record has none: 1
    if asked != "auto":
        return check_time_scale(asked), None
    if link_plan is None or not link_plan.shaped:
        return 1.0, None    # nothing is shaped: no frames to carry for a line
    from netem.capacity import CapacityError, host_capacity
    try:
        cap = host_capacity()
    except CapacityError as exc:
        raise ConfigError(f"run.time_scale = 'auto' cannot be resolved here: {exc}; give K "
                          "as a number") from None
    pairs = used_pairs(cfg, topo)
    streams = getattr(cfg.comm, "streams", 1)
    mss = link_plan.mtu - 52
    flows = plan_flows(link_plan, pairs, streams)

    def peak_at(k: float) -> float:
        return peak_frame_rate([r / k for r in flows], mss)

    k = pick_time_scale(peak_at, cap.frames_per_s)
    return k, AutoScale(k, peak_at(1.0), peak_at(k), cap.frames_per_s, AUTO_MARGIN,
                        cap.source)
