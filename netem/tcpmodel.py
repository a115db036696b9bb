"""How long TCP takes to move one message over a link: a pure, socket-free model.

``bytes * 8 / rate + one-way latency`` is what a link would take if TCP always had a window
of at least the bandwidth-delay product. Over a real round-trip time it does not: a message
sent after an idle period under cubic with ``tcp_slow_start_after_idle = 1`` (the Linux
default) starts again from the initial window and pays several round trips of slow start; a
lossy link caps the window; small buffers cap the rate at window / RTT. This module follows
one connection from message to message (``TcpConnection``) and answers, per message, its time
and what that time is made of (``TransferTime``).

The model works per round trip ("round"): a round sends up to one window of segments, at the
bottleneck rate, and the next round starts when the first ACK of this one is back (one RTT
plus one segment's serialisation) or when this round's data is all out, whichever is later.
Rounds whose outcome is known are taken in closed form (a pipe kept full, a window pinned by
the buffers, a loss cycle that repeats), so a 128 MB message at 1 Gbit/s costs a few rounds of
arithmetic, not one step per segment. A message offered in a state the connection has been
in before (same window, same idle restart, same size) is not worked out again: its time and
the state it leaves come from the connection's memo, to the bit (``_memo_key`` says what the
key holds and why the rest may be left out).

What is modelled, with the kernel source / RFC it follows:

- **Initial window** ``init_cwnd_segments`` (RFC 6928, the kernel's TCP_INIT_CWND = 10);
  ``ssthresh`` starts infinite (TCP_INFINITE_SSTHRESH).
- **Slow start** doubles the window per round: Linux grows cwnd by the number of segments each
  ACK covers (net/ipv4/tcp_cong.c tcp_slow_start, appropriate byte counting of RFC 3465
  without its limit L), so delayed ACKs (one per two segments) do not slow it down. It grows
  only while the window is used (tcp_is_cwnd_limited: cwnd < 2 x packets out in slow start).
- **HyStart** (cubic only, tcp_cubic.c hystart_update, once per connection: ``found`` is
  only cleared at init and after an RTO): the ACK-train test ends slow start when a round's
  ACK train lasts longer than half the minimum RTT (the threshold is halved for unpaced
  flows), if ACKs come at most 2 ms apart (hystart_ack_delta_us); ssthresh is then the window
  at that moment (the round's window + half a BDP of ACKs). ACKs come back in bursts: the
  rate limiter (HTB) releases a GSO packet whole, and the line forwards its segments at once,
  so ACKs are ``burst_segments`` (at least the delayed ACK's two) segments' time apart; over a
  shaped link below ~250 Mbit/s (64 KiB bursts) that is more than 2 ms and the ACK train
  never fires (measured: ssthresh stays infinite, or is set by the delay test, in
  benchmarks/bench_tcpmodel.py's lab). The delay test ends it when the queue a round leaves
  behind delays the next round by more than clamp(minRTT / 8, 4 ms, 16 ms)
  (HYSTART_DELAY_THRESH). Both act from a window of 16 (hystart_low_window).
- **Congestion avoidance**: reno +1 segment per round (tcp_cong_avoid_ai); cubic follows
  W(t) = C (t - K)^3 + W_max with C = 0.4, beta = 0.7, K = cbrt(W_max (1 - beta) / C) (RFC
  9438 sections 4.1-4.2; tcp_cubic.c bictcp_update evaluates it one min RTT ahead and grows at
  most by half the window per round), never below its Reno-friendly estimate growing by
  alpha = 3 (1 - beta) / (1 + beta) per round (RFC 9438 section 4.3, tcp_friendliness), with
  fast convergence (W_max = W (1 + beta) / 2 after a loss below the previous W_max). Cubic's
  clock stops while the connection is idle (cubictcp_cwnd_event on CA_EVENT_TX_START shifts
  the epoch by the idle time), so its time here is the connection's active time.
- **Restart after idle** (net/ipv4/tcp_output.c tcp_cwnd_restart, called from
  tcp_slow_start_after_idle_check): when ``slow_start_after_idle`` is on, the congestion
  control has no cong_control hook (cubic, reno; NOT bbr), nothing is in flight and the idle
  time since the last send exceeds the RTO: ssthresh = tcp_current_ssthresh = max(ssthresh,
  3/4 cwnd), then cwnd is halved once per RTO of idle time, but not below restart_cwnd =
  min(init_cwnd, cwnd). The RTO is srtt + rto_min on a steady path (tcp_set_rto: rttvar is
  kept at least tcp_rto_min, 200 ms), clamped to 120 s (TCP_RTO_MAX).
- **BBR** (tcp_bbr.c, BBR v1): startup grows the window by what is acked (doubling per round,
  at most bbr_high_gain = 2/ln2 x BDP) until the pipe or the buffers are full (our stand-in
  for bbr_check_full_bw_reached's three rounds without 25 % growth); from then on it sends at
  the bottleneck rate with cwnd = bbr_cwnd_gain (2) x BDP. It keeps cwnd and its bandwidth
  estimate over idle periods (its cong_control hook disables the restart; bbr_cwnd_event only
  resets pacing to the estimated rate). Random loss costs it the lost packets' share of the
  rate, up to a loss tolerance of 20 %; beyond that the goodput falls as tolerance / loss
  (a rough fit: BBR v1 has no loss response, but its bandwidth samples collapse).
- **Buffers**: bytes in flight <= min(receive buffer, send buffer) (the autotuning ceilings
  tcp_rmem[2] / tcp_wmem[2]), hence rate <= window / RTT.
- **Bottleneck queue**: the rate limiter's queue (HTB leaf pfifo, 1000 packets by default).
  A loss-based window beyond BDP + queue loses the excess (a loss event; slow start ends).
- **Random loss** ``loss_pct`` (independent per packet): loss events come every 1/p segments
  sent, counted across messages on the connection (the periodic-loss model under which Mathis
  et al. derive Reno's rate <= MSS / RTT x sqrt(3 / 2p), and RFC 8312 section 5.1 / RFC 9438
  derive CUBIC's response function; a Monte Carlo of the same rules with independent losses
  agrees to about 15 %). One window reduction per round (one congestion event per window,
  RFC 5681 / RFC 6675): reno halves, cubic multiplies by beta, bbr does not reduce. The lost
  segments are sent again (they cost rate: the loss sits after the rate limiter). Losses among
  the last round trip of a message delay its end until they are repaired (RACK-TLP, RFC
  8985): the expected delay for independent losses is added (``tail_repair_s``).
- **Striping** (``streams`` > 1): one exchange split evenly over N parallel connections that
  share the bottleneck. The N flows start alike and stay alike, so each is modelled as one
  connection with 1/N of the rate, the bytes and the queue, and its own window, buffers and
  initial window (an aggregate ramps N times faster and holds N loss-limited windows).

Left out (and why it is small or out of reach here):

- retransmission timeouts: RACK-TLP repairs single losses without one; heavy loss (several
  percent) hits RTOs in reality and is under-estimated here;
- the sawtooth's exact phase: a loss event's position is kept across messages, but a
  message whose end falls in a recovery is charged the expected tail cost, not the exact one;
- HyStart++ (RFC 9406: Linux keeps classic HyStart), PRR's gradual reduction (the window is
  set to ssthresh at once), ACK loss, ACK compression, delayed-ACK timer stalls (40 ms) for
  an odd last segment, the receiver's window autotuning ramp (it keeps ahead of slow start),
  the share of the receive buffer taken by skb overhead (tcp_adv_win_scale / scaling_ratio),
  BBR's PROBE_RTT (200 ms at 4 segments every 10 s without a new minimum RTT), its startup
  queue and drain, its pacing-gain cycle, and TCP small queues (TSQ: with the rate limiter
  on the sender's own interface, the kernel holds packets in the socket instead of the
  qdisc, so the queue rarely overflows from one flow; ``queue_pkts`` is then effectively
  large);
- the RTT is the path's: srtt (and so the RTO) adds the queue TCP small queues leave at the
  sender's rate limiter, about one GSO packet, not the whole flight beyond the BDP (the
  kernel's tcpi_rtt in the lab: 108 ms over a 100 ms path with cwnd 990); the RTT a
  window-limited round waits for is the path's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property

from netem.tcpsettings import CONGESTION_CONTROLS, HostTcp, TcpSettings, effective

LOSS_BASED = ("cubic", "reno")
DEFAULT_INIT_CWND = 10                 # RFC 6928, TCP_INIT_CWND
TCPIP_HEADER_BYTES = 52                # IPv4 20 + TCP 20 + timestamps option 12
DEFAULT_MSS_BYTES = 1500 - TCPIP_HEADER_BYTES
DEFAULT_RMEM_MAX_BYTES = 6_291_456     # tcp_rmem[2] of a kernel left alone
DEFAULT_WMEM_MAX_BYTES = 4_194_304     # tcp_wmem[2]
DEFAULT_QUEUE_PKTS = 1000              # the HTB leaves' pfifo limit
TCP_RTO_MAX_S = 120.0

RENO_BETA = 0.5
CUBIC_C = 0.4                          # segments / s^3 (RFC 9438 section 5)
CUBIC_BETA = 0.7
CUBIC_ALPHA = 3 * (1 - CUBIC_BETA) / (1 + CUBIC_BETA)   # Reno-friendly growth per round
CUBIC_MAX_GROWTH = 1.5                 # bictcp_update: ca->cnt >= 2, at most +1 per 2 ACKs
HYSTART_LOW_WINDOW = 16
DEFAULT_BURST_SEGMENTS = 65_536 // 1500    # a 64 KiB GSO packet (GSO_MAX_SIZE) at MTU 1500
HYSTART_ACK_DELTA_S = 0.002
HYSTART_DELAY_MIN_S, HYSTART_DELAY_MAX_S = 0.004, 0.016
BBR_HIGH_GAIN = 2 / math.log(2)
BBR_CWND_GAIN = 2.0
BBR_LOSS_TOLERANCE = 0.2

# the model's time constants a time-dilated run may have scaled by K or left fixed
# (``TcpParams.seen_at``); the kernel lets only rto_min be scaled (docs/NETWORK.md, "Time
# dilation")
DILATABLE = ("rto_min_s", "rto_max_s", "cubic_c", "hystart_ack_delta_s",
             "hystart_delay_min_s", "hystart_delay_max_s")

MAX_EXPLICIT_ROUNDS = 200_000          # then the rest at the average rate so far
MEMO_SIZE = 64                         # messages in one memo (``_memo_key``)
_EPS = 1e-9


class TcpModelError(ValueError):
    """A TCP model parameter is unknown or out of range."""


def _check_int(what: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise TcpModelError(f"{what} = {value!r} is out of range; expected an integer in "
                            f"[{lo}, {hi}]")


def _check_float(what: str, value: object, lo: float, hi: float, *, open_lo: bool = False,
                 open_hi: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and (lo < value if open_lo else lo <= value) \
        and (value < hi if open_hi else value <= hi)
    if not ok:
        raise TcpModelError(f"{what} = {value!r} is out of range; expected a number in "
                            f"{'(' if open_lo else '['}{lo:g}, {hi:g}{')' if open_hi else ']'}")


@dataclass(frozen=True)
class TcpParams:
    """One sender's TCP on one link, as the model needs it.

    ``wire_overhead``: bytes the rate limiter counts per payload byte. gasloc-emu's tc rates
    are corrected so that goodput = the configured rate (netem/commands.py overhead_factor):
    1.0. An uncorrected limiter counting IP packets has (mtu) / (mtu - 52), 1500 / 1448.
    ``burst_segments``: segments the bottleneck releases at once (a GSO packet, which HTB
    dequeues whole: 64 KiB by default, netem.commands.gso_segments on gasloc-emu's links);
    it spaces the ACKs HyStart's ACK-train test sees.
    """

    congestion_control: str = "cubic"
    slow_start_after_idle: bool = True
    init_cwnd_segments: int = DEFAULT_INIT_CWND
    mss_bytes: int = DEFAULT_MSS_BYTES
    wire_overhead: float = 1.0
    rcv_buf_bytes: int = DEFAULT_RMEM_MAX_BYTES
    snd_buf_bytes: int = DEFAULT_WMEM_MAX_BYTES
    rto_min_s: float = 0.2
    loss_pct: float = 0.0
    queue_pkts: int = DEFAULT_QUEUE_PKTS
    hystart: bool = True
    burst_segments: int = DEFAULT_BURST_SEGMENTS
    # the kernel's fixed time constants, in seconds of the clock the model runs on: under
    # time dilation (``seen_at``) the model runs on the emulated clock, where a constant the
    # kernel keeps in wall time is K times shorter (cubic's C, in segments / s^3, K^3 larger)
    cubic_c: float = CUBIC_C
    hystart_ack_delta_s: float = HYSTART_ACK_DELTA_S
    hystart_delay_min_s: float = HYSTART_DELAY_MIN_S
    hystart_delay_max_s: float = HYSTART_DELAY_MAX_S
    rto_max_s: float = TCP_RTO_MAX_S

    def __post_init__(self) -> None:
        if self.congestion_control not in CONGESTION_CONTROLS:
            raise TcpModelError(f"congestion_control = {self.congestion_control!r} is not "
                                f"modelled; expected one of {', '.join(CONGESTION_CONTROLS)}")
        for name in ("slow_start_after_idle", "hystart"):
            if not isinstance(getattr(self, name), bool):
                raise TcpModelError(f"{name} = {getattr(self, name)!r} is not true or false")
        _check_int("init_cwnd_segments", self.init_cwnd_segments, 1, 1000)
        _check_int("mss_bytes", self.mss_bytes, 64, 65_483)
        _check_float("wire_overhead", self.wire_overhead, 1.0, 2.0)
        _check_int("rcv_buf_bytes", self.rcv_buf_bytes, 4096, 2**31 - 1)
        _check_int("snd_buf_bytes", self.snd_buf_bytes, 4096, 2**31 - 1)
        _check_float("rto_max_s", self.rto_max_s, 0.0, TCP_RTO_MAX_S, open_lo=True)
        # above rto_max_s it is allowed, as in the kernel: the RTO is clamped to the maximum
        _check_float("rto_min_s", self.rto_min_s, 0.0, TCP_RTO_MAX_S, open_lo=True)
        _check_float("cubic_c", self.cubic_c, 0.0, 1e12, open_lo=True)
        for name in ("hystart_ack_delta_s", "hystart_delay_min_s", "hystart_delay_max_s"):
            _check_float(name, getattr(self, name), 0.0, 1.0)
        if self.hystart_delay_min_s > self.hystart_delay_max_s:
            raise TcpModelError(f"hystart_delay_min_s = {self.hystart_delay_min_s!r} is out "
                                f"of range; expected at most hystart_delay_max_s = "
                                f"{self.hystart_delay_max_s!r}")
        _check_float("loss_pct", self.loss_pct, 0.0, 100.0, open_hi=True)
        _check_int("queue_pkts", self.queue_pkts, 1, 1_000_000)
        _check_int("burst_segments", self.burst_segments, 1, 65_535)

    @classmethod
    def for_mtu(cls, mtu: int, **kwargs) -> TcpParams:
        """Parameters with the MSS of ``mtu`` (IPv4 and TCP headers with timestamps)."""
        _check_int("mtu", mtu, 576, 65_535)
        return cls(mss_bytes=mtu - TCPIP_HEADER_BYTES, **kwargs)

    def seen_at(self, time_scale: float, scaled: frozenset[str] = frozenset({"rto_min_s"})
                ) -> TcpParams:
        """These parameters as a run dilated by ``time_scale`` = K sees them on its emulated
        clock (wall / K; gasloc_emu.netplan's "Time dilation"): the link is K times slower and
        K times longer in wall time, so every time the connection makes of the path (RTT, a
        segment's time, the RTO's srtt) is the emulated one, and so is each constant in ``scaled``
        (set x K in the kernel: ``rto_min_s`` through the route's rto_min). Every other time
        constant stays what the kernel has in wall time: K times shorter on the emulated
        clock (HyStart's ACK spacing and delay thresholds, TCP_RTO_MAX), and cubic's
        W(t) = C t^3 grows K^3 times faster in emulated seconds. K = 1: these, unchanged."""
        _check_float("time_scale", time_scale, 1.0, 1000.0)
        unknown = sorted(set(scaled) - set(DILATABLE))
        if unknown:
            raise TcpModelError(f"scaled = {unknown[0]!r} is not a time constant of the model; "
                                f"expected some of {', '.join(DILATABLE)}")
        if time_scale == 1.0:
            return self
        k = float(time_scale)
        # each constant's value on the emulated clock: scaled ones are the undilated value
        # (the kernel was told K x it); fixed ones are the wall value / K (C: x K^3)
        fixed = {name: (getattr(self, name) * k ** 3 if name == "cubic_c"
                        else getattr(self, name) / k)
                 for name in DILATABLE if name not in scaled}
        return replace(self, **fixed)

    @cached_property   # asked several times per message: derived once
    def loss_based(self) -> bool:
        return self.congestion_control in LOSS_BASED

    @cached_property   # asked several times per message: derived once
    def restarts_after_idle(self) -> bool:
        """tcp_slow_start_after_idle_check: the sysctl, and no cong_control hook (not bbr)."""
        return self.slow_start_after_idle and self.loss_based

    @cached_property   # asked several times per message: derived once
    def beta(self) -> float:
        return {"reno": RENO_BETA, "cubic": CUBIC_BETA, "bbr": 1.0}[self.congestion_control]

    @cached_property   # asked several times per message: derived once
    def loss(self) -> float:
        return self.loss_pct / 100

    @cached_property   # asked several times per message: derived once
    def window_cap_segs(self) -> float:
        """Segments in flight the buffers allow: min(receive, send buffer) / MSS."""
        return min(self.rcv_buf_bytes, self.snd_buf_bytes) / self.mss_bytes


@dataclass(frozen=True)
class TransferTime:
    """One message's time from its first byte offered to its last byte received, and its
    split: ``serialisation_s`` (bytes at the line rate), ``propagation_s`` (one-way latency),
    ``window_s`` (waiting for the window: slow start, a restart, a window limit, waiting for
    an earlier message), ``retransmit_s`` (lost segments sent again, a repaired tail)."""

    total_s: float
    serialisation_s: float
    propagation_s: float
    window_s: float
    retransmit_s: float
    restarted: bool = False      # the window was restarted after idle first
    rounds: int = 0              # round trips the message took (per stream)

    @cached_property   # a memoised message's is asked again for every message like it
    def wire_s(self) -> float:
        """Until the last byte has left the sender's bottleneck: the total less the latency."""
        return self.total_s - self.propagation_s

    def as_dict(self) -> dict:
        return {"total_s": self.total_s, "serialisation_s": self.serialisation_s,
                "propagation_s": self.propagation_s, "window_s": self.window_s,
                "retransmit_s": self.retransmit_s}


# ---------------------------------------------------------------- steady-state references

def mathis_window_segs(loss: float) -> float:
    """Reno's average window under periodic loss p: sqrt(3 / 2p) segments (Mathis et al.
    1997); rate <= MSS / RTT x this."""
    _check_float("loss", loss, 0.0, 1.0, open_lo=True, open_hi=True)
    return math.sqrt(1.5 / loss)


def cubic_window_segs(loss: float, rtt_s: float, c: float = CUBIC_C) -> float:
    """CUBIC's average window under loss p (RFC 8312 section 5.1, RFC 9438 section 5.1):
    the larger of its cubic-region response (C (3 + beta) / (4 (1 - beta)))^(1/4) x
    RTT^(3/4) / p^(3/4) and its Reno-friendly one (alpha = 3 (1 - beta) / (1 + beta), which
    equals Reno's sqrt(3 / 2p))."""
    _check_float("rtt_s", rtt_s, 0.0, 1e4, open_lo=True)
    cubic = (c * (3 + CUBIC_BETA) / (4 * (1 - CUBIC_BETA))) ** 0.25 \
        * rtt_s ** 0.75 / loss ** 0.75
    reno_friendly = math.sqrt(CUBIC_ALPHA * (1 + CUBIC_BETA) / (2 * (1 - CUBIC_BETA) * loss))
    return max(cubic, reno_friendly)


def steady_rate_mbit(params: TcpParams, rate_mbit: float, rtt_s: float) -> float:
    """The goodput a long transfer settles at: the line rate, the buffers' window / RTT, and
    for a lossy link the congestion control's response function (bbr: the line rate less the
    loss, see the module docstring)."""
    line = rate_mbit / params.wire_overhead
    window = params.window_cap_segs * params.mss_bytes * 8 / rtt_s / 1e6 if rtt_s > 0 \
        else math.inf
    p = params.loss
    if p == 0:
        return min(line, window)
    if params.congestion_control == "bbr":
        return min(line * (1 - p) * min(1.0, BBR_LOSS_TOLERANCE / p), window)
    segs = mathis_window_segs(p) if params.congestion_control == "reno" \
        else cubic_window_segs(p, rtt_s, params.cubic_c)
    return min(line * (1 - p), window, segs * params.mss_bytes * 8 / rtt_s / 1e6)


def tail_repair_s(loss: float, last_rtt_segs: float, rtt_s: float) -> float:
    """The expected delay of a message's end by losses among its last round trip of data.

    A segment lost x round trips before the end (0 <= x <= 1) is seen missing and sent again
    about one RTT after it was first sent (RACK-TLP, RFC 8985; the very last segment waits for
    the tail loss probe at 2 srtt instead), so it ends the message (1 - x) RTT late. With
    independent losses at rate lambda = p x segments in the last RTT, the first one's x is
    exponential, and the expected delay is RTT x (1 - (1 - e^-lambda) / lambda)."""
    lam = loss * last_rtt_segs
    if lam <= 0:
        return 0.0
    if lam < 1e-6:
        return rtt_s * lam / 2
    return rtt_s * (1 - (1 - math.exp(-lam)) / lam)


# ---------------------------------------------------------------- one connection

@dataclass(frozen=True)
class _Path:
    """One stream's share of the link: its rate, the round trip and what follows."""

    rate_mbit: float
    rtt_s: float
    seg_s: float        # one segment at the stream's rate
    rtt_eff_s: float    # until the first ACK of a round is back: RTT + one segment
    bdp_segs: float     # segments the pipe holds at the stream's rate
    queue_segs: float   # the stream's share of the bottleneck queue


@dataclass
class _Round:
    """What the round loop returns to ``transfer``."""

    end_s: float = 0.0          # the last byte leaves the bottleneck
    lost_segs: float = 0.0
    rounds: int = 0
    last_rtt_segs: float = 0.0  # segments sent in the message's last round trip


class TcpConnection:
    """One persistent connection (or ``streams`` parallel ones striping each message), its
    congestion state kept from message to message."""

    # a long replay keeps thousands of connections and reads a few of their fields per
    # message: slots keep each connection's state in one small block
    __slots__ = ("params", "streams", "_memo", "memo_hits", "_link", "_path", "_cwnd",
                 "_ssthresh", "_hystart_found", "_last_send_s", "_ack_clock_s", "_round_left",
                 "_srtt_s", "_loss_acc", "_clock_s", "_w_max", "_epoch_s", "_k_s", "_origin",
                 "_reno_est", "_last_loss_w", "_bbr_full_bw", "_ticks", "_memoisable",
                 "_rtt_eff_s")

    def __init__(self, params: TcpParams, rate_mbit: float, rtt_s: float, streams: int = 1,
                 memo: dict | None = None):
        """``memo``: the memo of messages (``_memo_key``) to share with the connections of
        the same params, rate, RTT and streams (they time a message from a state alike); None:
        its own."""
        if not isinstance(params, TcpParams):
            raise TcpModelError(f"params must be TcpParams, got {params!r}")
        _check_int("streams", streams, 1, 1024)
        self.params, self.streams = params, streams
        self.set_path(rate_mbit, rtt_s)
        # the messages already timed from a state, by what they read (``_memo_key``)
        self._memo: dict[tuple, tuple] = {} if memo is None else memo
        self.memo_hits = 0
        self._cwnd = float(params.init_cwnd_segments)
        self._ssthresh = math.inf
        self._hystart_found = not (params.hystart and params.congestion_control == "cubic")
        self._last_send_s: float | None = None   # the last segment left the bottleneck
        self._ack_clock_s = -math.inf            # the next round may start (last round + RTT)
        self._round_left = 0.0                   # window the last round left unused
        self._srtt_s = self._path.rtt_eff_s      # the handshake's sample
        self._loss_acc = 0.0                     # segments x p since the last loss event
        self._clock_s = 0.0                      # active time: cubic's clock
        self._w_max = 0.0
        self._epoch_s: float | None = None
        self._k_s = 0.0
        self._origin = 0.0
        self._reno_est = 0.0
        self._last_loss_w = 0.0
        self._bbr_full_bw = False
        self._ticks: list[float] = []            # this message's steps of cubic's clock
        self._memoisable = True                  # no loss event, no cubic update (yet)

    # -- the path

    def set_path(self, rate_mbit: float, rtt_s: float) -> None:
        """The link changed (a scenario's event): the window and the rest are kept."""
        _check_float("rate_mbit", rate_mbit, 0.0, 1e7, open_lo=True)
        _check_float("rtt_s", rtt_s, 0.0, 1e4)
        p, n = self.params, self.streams
        self._link = (rate_mbit, rtt_s)
        rate = rate_mbit / n
        seg_s = p.mss_bytes * 8 * p.wire_overhead / (rate * 1e6)
        if p.congestion_control == "bbr" and p.loss > BBR_LOSS_TOLERANCE:
            seg_s *= p.loss / BBR_LOSS_TOLERANCE
        self._path = _Path(rate, rtt_s, seg_s, rtt_s + seg_s, (rtt_s + seg_s) / seg_s,
                           p.queue_pkts / n)
        self._rtt_eff_s = self._path.rtt_eff_s   # every message's idle test: kept at hand
        if hasattr(self, "_srtt_s"):    # the path of a live connection changed
            self._srtt_s = self._path.rtt_eff_s
            self._memo = {}     # its messages were timed on the old path: a memo of its own

    @property
    def path(self) -> tuple[float, float]:
        """(rate_mbit of the whole link, rtt_s), as last set."""
        return self._link

    @property
    def cwnd_segments(self) -> float:
        return self._cwnd

    @property
    def ssthresh_segments(self) -> float:
        return self._ssthresh

    def _queued_rtt_s(self, flight_segs: float) -> float:
        """The RTT a round of ``flight_segs`` samples: the path's, plus the bottleneck queue
        that TCP small queues leave (tcp_output.c tcp_small_queue_check: about one GSO
        packet in the qdisc of the sender's own interface, where the rate limiter is), not
        the whole flight beyond the BDP (measured: srtt 108 ms over a 100 ms path with cwnd
        990 at 50 Mbit/s)."""
        path = self._path
        queued = min(max(0.0, flight_segs - path.bdp_segs), float(self.params.burst_segments))
        return path.rtt_eff_s + queued * path.seg_s

    def rto_s(self) -> float:
        """tcp_set_rto on a steady path: srtt + rttvar, rttvar held at least rto_min."""
        return min(self._srtt_s + self.params.rto_min_s, self.params.rto_max_s)

    # -- one message

    def transfer(self, nbytes: int, start_s: float) -> TransferTime:
        """The message of ``nbytes`` offered at ``start_s`` (the caller's clock); the time
        since the previous message's last send is the connection's idle time. A message
        offered before the previous one is out waits for it (one connection is a FIFO)."""
        if not (type(nbytes) is int and 0 <= nbytes <= 2**62):   # the common case at once
            _check_int("nbytes", nbytes, 0, 2**62)
        if not (type(start_s) is float and -1e15 <= start_s <= 1e15):
            _check_float("start_s", start_s, -1e15, 1e15)
        if nbytes == 0:
            owd = self._path.rtt_s / 2
            return TransferTime(owd, 0.0, owd, 0.0, 0.0)
        last = self._last_send_s        # into the message's own frame, where it starts at 0
        if last is not None:            # (and out of it at the end)
            last = self._last_send_s = last + -start_s
        self._ack_clock_s += -start_s
        t0 = 0.0 if last is None or not last > 0.0 else last    # max(0.0, last)
        # ``_after_idle``'s first tests, which most messages stop at, inline
        if last is None or t0 < last + self._rtt_eff_s:
            restarted = False               # nothing sent yet, or still in flight
        elif not self.params.restarts_after_idle:
            restarted, self._round_left = False, 0.0    # idle, but never restarts (bbr)
        else:
            restarted = self._after_idle(t0)
        key = self._memo_key(nbytes, t0, restarted)
        timed = self._memo.get(key) if key is not None else None
        if timed is None:
            timed = self._message(nbytes, t0, restarted)
            if key is not None and self._memoisable:
                if len(self._memo) >= MEMO_SIZE:
                    self._memo.clear()     # keys that never came back
                self._memo[key] = timed
        else:   # a memo hit: the state the message left, set again, and cubic's clock
            self.memo_hits += 1     # advanced by the same steps in the same order
            (_, self._cwnd, self._ssthresh, self._hystart_found, self._srtt_s, self._loss_acc,
             self._bbr_full_bw, self._last_send_s, self._ack_clock_s, self._round_left,
             ticks) = timed
            for dt in ticks:
                self._clock_s += dt
        self._last_send_s += start_s    # out of the message's frame (the message set it)
        self._ack_clock_s += start_s
        return timed[0]

    # -- the memo of messages: the same message from the same state is timed once

    def _memo_key(self, nbytes: int, t0: float, restarted: bool) -> tuple | None:
        """Everything a message's rounds read, when they start at once (``t0`` = 0, the
        message's offer) and the previous message's rounds are over (its ACK clock <= 0:
        neither that clock nor the window left in its last round is read then); None
        otherwise (not memoised).

        Left out, on purpose: the idle time (``_after_idle`` has acted on it already:
        ``restarted`` and the window are in the key), and cubic's function and clock
        (``_clock_s``, ``_epoch_s``, ``_w_max``, ``_k_s``, ``_origin``, ``_reno_est``) and
        ``_last_loss_w``, which only a loss event or a cubic update reads or writes
        (``_on_loss``, ``_cubic_grow``): a message that has either is not stored
        (``_memoisable``). Every other message is a function of its key alone (and of the
        params, the path and the streams, which the connections sharing a memo have alike;
        ``set_path`` gives a connection a memo of its own), and the clock it
        advances is replayed step by step (``_ticks``), so a replay is the computation's
        result to the bit."""
        if t0 != 0.0 or self._ack_clock_s > 0.0:
            return None     # it waits for the previous message: its start is seldom seen again
        return (nbytes, restarted, self._cwnd, self._ssthresh, self._hystart_found,
                self._srtt_s, self._loss_acc, self._bbr_full_bw)

    def _message(self, nbytes: int, t0: float, restarted: bool) -> tuple:
        """Time the message in its own frame (it is offered at 0, its rounds start at
        ``t0``); what it left behind, as a memo hit sets it again (``transfer``)."""
        path, p = self._path, self.params
        owd = path.rtt_s / 2
        self._ticks, self._memoisable = [], True
        run = self._rounds(nbytes / self.streams / p.mss_bytes, t0)
        loss = p.loss
        tail_s = tail_repair_s(loss, run.last_rtt_segs, path.rtt_s) if loss > 0 else 0.0
        self._last_send_s = run.end_s + tail_s
        total = run.end_s + tail_s + owd
        ser = nbytes * 8 * p.wire_overhead / (path.rate_mbit * self.streams * 1e6)
        beyond = max(0.0, total - ser - owd)
        retransmit = min(beyond, tail_s + run.lost_segs * path.seg_s)
        tt = TransferTime(total, ser, owd, beyond - retransmit, retransmit, restarted,
                          run.rounds)
        return (tt, self._cwnd, self._ssthresh, self._hystart_found, self._srtt_s,
                self._loss_acc, self._bbr_full_bw, self._last_send_s, self._ack_clock_s,
                self._round_left, tuple(self._ticks))

    def _tick(self, dt_s: float) -> None:
        """Cubic's clock (the connection's active time) advances by ``dt_s``."""
        self._clock_s += dt_s
        self._ticks.append(dt_s)

    def _after_idle(self, t_s: float) -> bool:
        """The window after the idle time before ``t_s`` (tcp_slow_start_after_idle_check)."""
        if self._last_send_s is None or t_s < self._last_send_s + self._path.rtt_eff_s:
            return False   # nothing sent yet, or still in flight: not idle
        self._round_left = 0.0
        idle_s = t_s - self._last_send_s
        if not self.params.restarts_after_idle or idle_s <= self.rto_s():
            return False
        self._cwnd_restart(idle_s)
        return True

    def _cwnd_restart(self, delta_s: float) -> None:
        """net/ipv4/tcp_output.c tcp_cwnd_restart."""
        restart = min(float(self.params.init_cwnd_segments), self._cwnd)
        self._ssthresh = max(self._ssthresh, 0.75 * self._cwnd)   # tcp_current_ssthresh
        cwnd, rto = self._cwnd, self.rto_s()
        while (delta_s := delta_s - rto) > 0 and cwnd > restart:
            cwnd = math.floor(cwnd) // 2
        self._cwnd = max(float(cwnd), restart)

    # -- the rounds of one message

    def _window(self) -> float:
        return min(self._cwnd, self.params.window_cap_segs)

    def _rounds(self, segs: float, t_s: float) -> _Round:
        """Send ``segs`` segments from ``t_s``, round by round; see the module docstring."""
        path, p = self._path, self.params.loss
        out, remaining, events, explicit = _Round(), segs, [], 0
        t0 = t_s
        if t_s < self._ack_clock_s:        # the previous message's round is still going
            allowance, next_round = self._round_left, self._ack_clock_s
        else:
            allowance, next_round = None, 0.0
        while True:
            if allowance is None:
                finished = self._closed_form(remaining, t_s, out)
                if finished is not None:
                    return finished
                w = self._window()
                allow, next_round = w, t_s + path.rtt_eff_s
            else:
                w = self._window()
                allow, allowance = min(allowance, w), None
            need = remaining / (1 - p)
            send = min(allow, need)
            through = send if not self.params.loss_based else min(send, path.bdp_segs
                                                                  + path.queue_segs)
            dropped = send - through
            if dropped <= 0 and send >= need - _EPS:
                return self._last_round(out, t_s, need, allow, next_round)
            out.lost_segs += through * p + dropped
            remaining -= through * (1 - p)
            t_next = max(next_round, t_s + through * path.seg_s)
            self._tick(t_next - t_s)
            self._srtt_s = self._queued_rtt_s(through)
            out.rounds += 1
            explicit += 1
            if self._after_round(send, through, dropped, w):
                events.append((self._last_loss_w, t_next, remaining, out.rounds,
                               out.lost_segs, self._clock_s))
                remaining, t_next = self._skip_cycles(events, remaining, t_next, out)
            t_s = t_next
            if explicit >= MAX_EXPLICIT_ROUNDS:
                return self._at_average(out, t0, t_s, segs, remaining)

    def _last_round(self, out: _Round, t_s: float, need: float, allow: float,
                    next_round: float) -> _Round:
        path = self._path
        out.end_s = t_s + need * path.seg_s
        out.lost_segs += need * self.params.loss
        out.rounds += 1
        saturated = need * path.seg_s >= next_round - t_s
        out.last_rtt_segs = min(need, path.bdp_segs) if saturated else need
        self._tick(need * path.seg_s)
        self._after_round(need, need, 0.0, self._window())
        self._ack_clock_s, self._round_left = (out.end_s, 0.0) if saturated \
            else (next_round, max(0.0, allow - need))
        return out

    def _finish_at_line(self, out: _Round, t_s: float, remaining: float,
                        top_segs: float | None = None) -> _Round:
        """The rest with the pipe kept full; ``top_segs``: the window grows meanwhile (at
        most to that) as congestion avoidance grows it."""
        path, p = self._path, self.params.loss
        need = remaining / (1 - p)
        duration_s = need * path.seg_s
        if top_segs is not None and self._cwnd < top_segs:
            self._grow_saturated(duration_s, top_segs)
        out.end_s = t_s + duration_s
        out.lost_segs += need * p
        w = min(self._cwnd, self.params.window_cap_segs)   # ``_window``: cwnd is set by now
        out.rounds += max(1, math.ceil(need / max(w, 1.0)))
        out.last_rtt_segs = min(need, path.bdp_segs)
        self._tick(duration_s)
        self._ack_clock_s, self._round_left = out.end_s, 0.0
        self._srtt_s = self._queued_rtt_s(w)
        self._loss_acc = math.fmod(self._loss_acc + need * p, 1.0)
        return out

    def _grow_saturated(self, duration_s: float, top_segs: float) -> None:
        """Congestion avoidance over ``duration_s`` of full-pipe rounds, up to ``top_segs``
        (the buffers' cap, or BDP + queue where a loss would cut it: the sawtooth's top)."""
        path, clock0 = self._path, self._clock_s
        round_s = max(path.rtt_eff_s, self._window() * path.seg_s)
        rounds = duration_s / round_s
        if self.params.congestion_control == "reno":
            self._cwnd = min(top_segs, self._cwnd + rounds)
            return
        for _ in range(min(math.ceil(rounds), 256)):
            self._clock_s += round_s
            self._cubic_grow(self._cwnd)
            if self._cwnd >= top_segs:
                break
        self._cwnd, self._clock_s = min(self._cwnd, top_segs), clock0

    def _closed_form(self, remaining: float, t_s: float, out: _Round) -> _Round | None:
        """The rest of the message in closed form, where its rounds are known: None if not."""
        path, params = self._path, self.params
        cap = params.window_cap_segs
        w = min(self._cwnd, cap)    # ``_window``
        saturated = w >= path.bdp_segs
        if params.congestion_control == "bbr":
            if self._bbr_full_bw and (saturated or w >= cap - _EPS):
                return self._finish_at_line(out, t_s, remaining) if saturated \
                    else self._finish_pinned(out, t_s, remaining, w)
            return None
        if params.loss > 0 or self._cwnd < self._ssthresh:
            return None     # random loss: explicit rounds (and cycles); slow start: log rounds
        held = path.bdp_segs + path.queue_segs
        if saturated and (cap <= held or params.beta * held >= path.bdp_segs):
            # full from now on: the window grows to the buffers' cap, or saws between
            # beta x (BDP + queue) and BDP + queue, never below the BDP
            return self._finish_at_line(out, t_s, remaining, top_segs=min(cap, held))
        if not saturated and self._cwnd >= cap - _EPS:
            return self._finish_pinned(out, t_s, remaining, w)
        return None

    def _finish_pinned(self, out: _Round, t_s: float, remaining: float, w: float) -> _Round:
        """Rounds of the same window, ``w`` < the BDP, one per round trip."""
        path, p = self._path, self.params.loss
        need = remaining / (1 - p)
        full = max(0, math.ceil(need / w - _EPS) - 1)
        last = need - full * w
        out.lost_segs += need * p
        start_last = t_s + full * path.rtt_eff_s
        out.end_s = start_last + last * path.seg_s
        out.rounds += full + 1
        out.last_rtt_segs = last
        self._tick(out.end_s - t_s)
        self._srtt_s = path.rtt_eff_s
        self._ack_clock_s, self._round_left = start_last + path.rtt_eff_s, w - last
        return out

    def _at_average(self, out: _Round, t0: float, t_s: float, segs: float,
                    remaining: float) -> _Round:
        """Past MAX_EXPLICIT_ROUNDS: the rest at the average rate of the message so far."""
        done = segs - remaining
        out.end_s = t_s + remaining * (t_s - t0) / max(done, _EPS)
        out.last_rtt_segs = min(remaining, self._window())
        self._ack_clock_s, self._round_left = out.end_s, 0.0
        return out

    def _skip_cycles(self, events: list, remaining: float, t_s: float,
                     out: _Round) -> tuple[float, float]:
        """Loss events whose windows repeat (period 1 or 2): skip the whole cycles left, all
        but one, in closed form (the periodic-loss sawtooth is periodic)."""
        last = events[-1]
        for period in (1, 2):
            if len(events) <= period + 1:
                continue
            prev = events[-1 - period]
            if abs(last[0] - prev[0]) > 0.01 * last[0]:
                continue
            d_rem, d_t = prev[2] - last[2], last[1] - prev[1]
            if d_rem <= 0:
                continue
            m = math.floor(remaining / d_rem) - 1
            if m < 1:
                return remaining, t_s
            out.rounds += m * (last[3] - prev[3])
            out.lost_segs += m * (last[4] - prev[4])
            self._tick(m * (last[5] - prev[5]))
            events.clear()
            return remaining - m * d_rem, t_s + m * d_t
        return remaining, t_s

    # -- the window after a round

    def _after_round(self, send: float, through: float, dropped: float, w: float) -> bool:
        """Grow or cut the window after a round of ``send`` segments (``through`` of them
        past the queue); True when the round had a loss event."""
        p = self.params.loss
        self._loss_acc += through * p
        loss_event = dropped > _EPS
        if self._loss_acc >= 1.0:
            loss_event, self._loss_acc = True, self._loss_acc - math.floor(self._loss_acc)
        if self.params.congestion_control == "bbr":
            self._bbr_round(through, w)
            return False
        if loss_event:
            in_ss = self._cwnd < self._ssthresh
            # the window when the loss is seen: slow start has grown it by the ACKs before
            # the lost segment (half the round on average for a random loss)
            self._on_loss(self._cwnd + (through / 2 if in_ss and not dropped else 0.0))
            return True
        self._grow(send, through)
        return False

    def _on_loss(self, w: float) -> None:
        """A congestion event (tcp_enter_recovery -> the CC's ssthresh; PRR ends at it)."""
        self._memoisable = False     # reads and sets what the memo's key leaves out
        self._last_loss_w = w
        if self.params.congestion_control == "cubic":
            # bictcp_recalc_ssthresh, with fast convergence
            self._w_max = w * (1 + CUBIC_BETA) / 2 if w < self._w_max else w
            self._epoch_s = None
        self._ssthresh = max(w * self.params.beta, 2.0)
        self._cwnd = self._ssthresh
        self._hystart_found = True

    def _grow(self, send: float, through: float) -> None:
        cwnd = self._cwnd
        if cwnd < self._ssthresh:
            if send > cwnd / 2:                       # tcp_is_cwnd_limited in slow start
                self._hystart(through)
                self._cwnd = min(cwnd + through, self._ssthresh)
            return
        if send < cwnd - 1e-6:                        # not cwnd-limited: no growth
            return
        if self.params.congestion_control == "reno":
            self._cwnd = cwnd + through / cwnd        # tcp_cong_avoid_ai
        else:
            self._cubic_grow(through)

    def _hystart(self, through: float) -> None:
        """tcp_cubic.c hystart_update, on the round just acked (see the module docstring)."""
        if self._hystart_found or self._cwnd < HYSTART_LOW_WINDOW:
            return
        path = self._path
        ack_gap_s = max(2, self.params.burst_segments) * path.seg_s
        if ack_gap_s <= self.params.hystart_ack_delta_s and through * path.seg_s > path.rtt_s / 2:
            self._hystart_found = True
            self._ssthresh = self._cwnd + path.rtt_s / (2 * path.seg_s)
            return
        eta_s = min(max(path.rtt_s / 8, self.params.hystart_delay_min_s),
                    self.params.hystart_delay_max_s)
        if (through - path.bdp_segs) * path.seg_s > eta_s:
            self._hystart_found = True
            self._ssthresh = self._cwnd + through

    def _cubic_grow(self, through: float) -> None:
        """One round of tcp_cubic.c bictcp_update + tcp_friendliness (RFC 9438 4.1-4.3)."""
        self._memoisable = False     # reads cubic's clock, which the memo's key leaves out
        cwnd = self._cwnd
        if self._epoch_s is None:
            self._epoch_s, self._reno_est = self._clock_s, cwnd
            if self._w_max <= cwnd:
                self._k_s, self._origin = 0.0, cwnd
            else:
                self._k_s = ((self._w_max - cwnd) / self.params.cubic_c) ** (1 / 3)
                self._origin = self._w_max
        t = self._clock_s - self._epoch_s + self._path.rtt_s
        target = self._origin + self.params.cubic_c * (t - self._k_s) ** 3
        self._reno_est += CUBIC_ALPHA * through / cwnd
        goal = max(target, self._reno_est)
        if goal > cwnd:
            self._cwnd = min(goal, CUBIC_MAX_GROWTH * cwnd)

    def _bbr_round(self, through: float, w: float) -> None:
        """tcp_bbr.c, coarsely: startup grows by what is acked, up to high_gain x BDP, until
        the pipe or the buffers are full; then cwnd_gain x BDP."""
        path, cap = self._path, self.params.window_cap_segs
        if not self._bbr_full_bw:
            self._cwnd = min(self._cwnd + through, BBR_HIGH_GAIN * path.bdp_segs)
            if w >= path.bdp_segs or w >= cap - _EPS:
                self._bbr_full_bw = True
        if self._bbr_full_bw:
            self._cwnd = max(BBR_CWND_GAIN * path.bdp_segs, 4.0)


def after_idle_series(params: TcpParams, rate_mbit: float, rtt_s: float, nbytes: int,
                      idle_s: float, messages: int, streams: int = 1) -> list[TransferTime]:
    """Messages of ``nbytes`` on one persistent connection, each offered ``idle_s`` after the
    previous one has arrived (how the delay-line measurements were taken)."""
    _check_int("messages", messages, 1, 1_000_000)
    _check_float("idle_s", idle_s, 0.0, 1e6)
    conn, t_s, out = TcpConnection(params, rate_mbit, rtt_s, streams), 0.0, []
    for _ in range(messages):
        out.append(conn.transfer(nbytes, t_s))
        t_s += out[-1].total_s + idle_s
    return out


# ---------------------------------------------------------------- settings and the host

def params_for(settings: TcpSettings | None, host: HostTcp, *, mtu: int = 1500,
               loss_pct: float = 0.0, queue_pkts: int = DEFAULT_QUEUE_PKTS,
               wire_overhead: float = 1.0, burst_segments: int = 0) -> TcpParams:
    """The model's parameters for one sender's link: ``settings`` (a link's ``TcpSettings``,
    None = all defaults) over ``host`` (``tcpsettings.read_original_host()``: what a worker
    namespace starts from), as ``tcpsettings.effective`` resolves them (the project's one rule
    for what a namespace ends up with).

    What the host does not say keeps the kernel's default (tcp_rmem[2] / tcp_wmem[2] of a
    kernel left alone); a congestion control the model does not know (htcp, vegas, ...) is
    modelled as cubic, the kernel's default loss-based one. ``burst_segments`` 0: a 64 KiB
    GSO packet at ``mtu``."""
    eff = effective(settings if settings is not None else TcpSettings(), host)
    cc = eff["congestion_control"]
    return TcpParams.for_mtu(
        mtu, congestion_control=cc if cc in CONGESTION_CONTROLS else "cubic",
        slow_start_after_idle=eff["slow_start_after_idle"] != 0,
        init_cwnd_segments=eff["init_cwnd"] or DEFAULT_INIT_CWND,
        rcv_buf_bytes=eff["rmem_max_bytes"] or DEFAULT_RMEM_MAX_BYTES,
        snd_buf_bytes=eff["wmem_max_bytes"] or DEFAULT_WMEM_MAX_BYTES,
        loss_pct=float(loss_pct), queue_pkts=queue_pkts, wire_overhead=wire_overhead,
        burst_segments=burst_segments or max(1, 65_536 // mtu),
        rto_min_s=min(float(eff.get("rto_min_ms", 200.0)) / 1e3, TCP_RTO_MAX_S))


__all__ = ["TcpConnection", "TcpModelError", "TcpParams", "TransferTime", "after_idle_series",
           "cubic_window_segs", "mathis_window_segs", "params_for", "steady_rate_mbit",
           "tail_repair_s"]
