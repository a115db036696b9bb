"""Time dilation: a network and machine the host cannot carry, emulated K times slower (Gupta
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
  them (``dilate_state``), TCP's minimum RTO (the route's rto_min, K x 200 ms; the only TCP
  timer the kernel lets a namespace stretch, docs/NETWORK.md "Time dilation"), and every
  sleep of a worker (``WorkerClock.sleep``: a nominal step's pacing, a scenario's pause, the
  failure-detect wait). Scenario, link-trace and fault times and the round budget stay in
  the config's (emulated) seconds and are compared with the emulated clock, so they fall K
  times later in wall time.
- Emulated (/ K), what a worker measures and reports (``WorkerClock``): compute_s, comm_s,
  wait_s, the link observations (transfer_s, sent_s), the row's time_s, A2CiD2's step and
  exchange spans and its time unit, and the run clock a timed event is due by.
- Neither (wall seconds, machinery, not the emulated run): the heartbeat period, the
  launcher's backstop timeouts for a silent or stuck worker (they must outlast K times longer
  rounds: the launcher multiplies them by ``plan.time_scale``), TCP sampling intervals.

What the kernel keeps in wall time whatever K is (delayed-ACK timer, HyStart's thresholds,
cubic's C, BBR's windows, the initial and maximum RTO) is K times shorter on the emulated
clock; ``netem.tcpmodel.TcpParams.seen_at`` is the model of that, which ``simulate`` uses
so that it predicts what the dilated emulator sees.

Everything here but the capacity measurement (``netem.capacity``) is pure: the RunPlan
derives the dilated link plan and its clock from these functions once.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from gasloc_emu.config import ConfigError

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
