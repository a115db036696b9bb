"""TCP as a property of the link: congestion control, idle restart, buffers, initial window.

What a wide-area transfer costs depends as much on the sender's TCP as on the wire: the same
0.48 MB message over a 50 Mbit/s, 50 ms link takes 4.5 times longer under cubic with slow
start after idle (the Linux default) than under bbr (docs/NETWORK.md). So a run states its TCP
and records what it had.

Where each knob lives in the kernel, and how it is set here:

- **Congestion control.** ``net.ipv4.tcp_congestion_control`` is per network namespace, but a
  namespace other than the initial one may only pick a name from the host's
  ``tcp_allowed_congestion_control`` (net/ipv4/tcp_cong.c, tcp_set_default_congestion_control:
  -EPERM unless the algorithm is TCP_CONG_NON_RESTRICTED); on this machine kind that list is
  reno and bbr, so cubic would be refused. ZeroMQ does not expose ``TCP_CONGESTION`` for its
  sockets either. A route's ``congctl`` attribute (RTAX_CC_ALGO, read by tcp_ca_dst_init for
  every connection over the route) has no such restriction, so a worker namespace gets
  ``ip route replace <peers> dev eth0 congctl NAME``: one route for the whole /15, and a /32
  per peer whose link overrides it. The kernel must have the algorithm
  (``tcp_available_congestion_control``), else the run is refused.
- **Slow start after idle** (``net.ipv4.tcp_slow_start_after_idle``) is per namespace and set
  in each worker's; it is the sender's setting that counts (tcp_output.c,
  tcp_slow_start_after_idle_check), so it cannot differ between the links of one sender.
- **Socket buffers**: the maxima of ``net.ipv4.tcp_rmem`` / ``tcp_wmem`` (per namespace; the
  autotuning ceiling that bounds bytes in flight, hence rate <= window / RTT).
  ``net.core.rmem_max`` is the host's alone and not touched.
- **Initial window**: the route's ``initcwnd`` (and ``initrwnd``, so the receiver advertises
  as much).
- **Minimum RTO**: the route's ``rto_min`` (RTAX_RTO_MIN, locked: net/ipv4/tcp_input.c
  tcp_rto_min reads it over the namespace's tcp_rto_min_us for every connection on the
  route), per link like the rest of the route's attributes; kernels before 6.11 have no
  sysctl, every kernel has the route attribute. A time-dilated run sets it to K x 200 ms
  (``gasloc_emu.netplan``, "Time dilation"): the one TCP timer the kernel lets a namespace stretch.

Everything here is pure: ``TcpSettings`` validates, ``worker_commands`` says what to run in a
worker's namespace, ``read_host`` / ``host_record`` read /proc for the run record.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

CONGESTION_CONTROLS = ("cubic", "reno", "bbr")
IDLE_RESTART = (-1, 0, 1)              # -1: leave the namespace's default (1, the kernel's)
BUFFER_RANGE_BYTES = (4096, 2**31 - 1)
INIT_CWND_RANGE = (0, 1000)            # 0: the kernel's (10 segments, RFC 6928)
RTO_MIN_RANGE_MS = (1.0, 200_000.0)    # 0: the kernel's TCP_RTO_MIN (200 ms)
KERNEL_RTO_MIN_MS = 200.0              # include/net/tcp.h TCP_RTO_MIN (HZ / 5)
PROC_IPV4 = Path("/proc/sys/net/ipv4")
# the kernel's own defaults in a new network namespace (net/ipv4/tcp_ipv4.c tcp_sk_init and
# tcp.c tcp_init): what a worker namespace has where a setting is left alone
NETNS_DEFAULT_SSAI = 1


class TcpSettingsError(ValueError):
    """A TCP setting is unknown, out of range, or not possible on this host."""


def _check_int(what: str, value: object, lo: int, hi: int, note: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise TcpSettingsError(f"{what} = {value!r} is out of range; expected an integer in "
                               f"[{lo}, {hi}]{note}")
    return value


@dataclass(frozen=True)
class TcpSettings:
    """One sender's TCP for one link. Empty / 0 / -1 fields leave the namespace's default."""

    congestion_control: str = ""
    slow_start_after_idle: int = -1
    rmem_max_bytes: int = 0
    wmem_max_bytes: int = 0
    init_cwnd: int = 0
    rto_min_ms: float = 0.0

    def __post_init__(self) -> None:
        cc = self.congestion_control
        if cc and cc not in CONGESTION_CONTROLS:
            raise TcpSettingsError(f"tcp congestion_control = {cc!r} is not allowed; expected "
                                   f"one of {', '.join(CONGESTION_CONTROLS)} (or '' for the "
                                   "host's)")
        if self.slow_start_after_idle not in IDLE_RESTART or \
                isinstance(self.slow_start_after_idle, bool):
            raise TcpSettingsError(f"tcp slow_start_after_idle = {self.slow_start_after_idle!r} "
                                   "is not allowed; expected 0, 1 or -1 (the namespace's "
                                   "default)")
        for name in ("rmem_max_bytes", "wmem_max_bytes"):
            value = getattr(self, name)
            if value:
                _check_int(f"tcp {name}", value, *BUFFER_RANGE_BYTES, " (0: the default)")
        _check_int("tcp init_cwnd", self.init_cwnd, *INIT_CWND_RANGE, " (0: the kernel's 10)")
        ms = self.rto_min_ms
        lo, hi = RTO_MIN_RANGE_MS
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or \
                not (ms == 0 or lo <= ms <= hi):
            raise TcpSettingsError(f"tcp rto_min_ms = {ms!r} is out of range; expected 0 (the "
                                   f"kernel's 200 ms) or a number in [{lo:g}, {hi:g}]")

    def merged(self, over: TcpSettings) -> TcpSettings:
        """These settings with every field that ``over`` sets replacing ours."""
        mine, theirs = asdict(self), asdict(over)
        return TcpSettings(**{k: (v if v != UNSET.get(k, 0) else mine[k])
                              for k, v in theirs.items()})

    @property
    def is_default(self) -> bool:
        return self == TcpSettings()

    def route_args(self) -> list[str]:
        """The route attributes these settings put on a worker's routes (may be empty)."""
        args: list[str] = []
        if self.init_cwnd:
            args += ["initcwnd", str(self.init_cwnd), "initrwnd", str(self.init_cwnd)]
        if self.congestion_control:
            args += ["congctl", self.congestion_control]
        if self.rto_min_ms:   # iproute2 takes whole ms here (RTAX_RTO_MIN is kept in ms)
            args += ["rto_min", f"{max(1, round(self.rto_min_ms))}ms"]
        return args

    @classmethod
    def from_table(cls, where: str, table: Mapping) -> TcpSettings:
        """From a profile's ``[tcp]`` table (or a link's tcp keys), naming ``where`` on error."""
        allowed = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(table) - allowed)
        if unknown:
            raise TcpSettingsError(f"{where}: unknown key {unknown[0]!r}; allowed: "
                                   f"{', '.join(sorted(allowed))}")
        try:
            return cls(**dict(table))
        except TcpSettingsError as exc:
            raise TcpSettingsError(f"{where}: {exc}") from None

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- the host

@dataclass(frozen=True)
class HostTcp:
    """What a host (or a namespace) has: read from /proc, for the checks and the record."""

    congestion_control: str
    available: tuple[str, ...]
    allowed: tuple[str, ...]
    slow_start_after_idle: int
    rmem: tuple[int, ...]
    wmem: tuple[int, ...]
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["available"], out["allowed"] = list(self.available), list(self.allowed)
        out["rmem"], out["wmem"] = list(self.rmem), list(self.wmem)
        return out


def _read(root: Path, name: str, default: str = "") -> str:
    try:
        return (root / name).read_text().strip()
    except OSError:
        return default


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split())
    except ValueError:
        return ()


def read_host(root: Path = PROC_IPV4) -> HostTcp:
    """This process's network namespace's TCP settings (``root``: a /proc/sys/net/ipv4)."""
    ssai = _read(root, "tcp_slow_start_after_idle", "-1")
    return HostTcp(congestion_control=_read(root, "tcp_congestion_control"),
                   available=tuple(_read(root, "tcp_available_congestion_control").split()),
                   allowed=tuple(_read(root, "tcp_allowed_congestion_control").split()),
                   slow_start_after_idle=int(ssai) if ssai.lstrip("-").isdigit() else -1,
                   rmem=_ints(_read(root, "tcp_rmem")), wmem=_ints(_read(root, "tcp_wmem")))


HOST_ENV = "GASLOC_EMU_HOST_TCP"   # the host's TCP, read before re-executing into a namespace


def host_snapshot_env() -> dict[str, str]:
    """The host's TCP as an environment entry, for a process about to enter its own network
    namespace, whose /proc/sys then shows the namespace's values instead."""
    return {HOST_ENV: json.dumps(read_host().as_dict())}


def read_original_host(environ: Mapping[str, str] | None = None) -> HostTcp:
    """The host's TCP: the snapshot taken before the re-exec when there is one (it is trusted
    no further than its types), else this namespace's own values."""
    text = (environ if environ is not None else os.environ).get(HOST_ENV)
    if not text:
        return read_host()
    try:
        d = json.loads(text)
        return HostTcp(str(d["congestion_control"]), tuple(map(str, d["available"])),
                       tuple(map(str, d["allowed"])), int(d["slow_start_after_idle"]),
                       tuple(map(int, d["rmem"])), tuple(map(int, d["wmem"])))
    except (ValueError, KeyError, TypeError):
        return read_host()


UNSET = {"congestion_control": "", "slow_start_after_idle": -1}    # other fields: 0


def differences(asked: list[TcpSettings], host: HostTcp) -> list[dict]:
    """What the plan asks that a host's own TCP does not have (where nothing can be set)."""
    got = {"congestion_control": host.congestion_control,
           "slow_start_after_idle": host.slow_start_after_idle,
           "rmem_max_bytes": host.rmem[-1] if host.rmem else 0,
           "wmem_max_bytes": host.wmem[-1] if host.wmem else 0, "init_cwnd": 10,
           "rto_min_ms": KERNEL_RTO_MIN_MS}
    out: dict[tuple, dict] = {}
    for settings in asked:
        for k, v in settings.as_dict().items():
            if v != UNSET.get(k, 0) and got[k] != v:
                out[(k, v)] = {"setting": k, "asked": v, "host": got[k]}
    return list(out.values())


def check_possible(settings: list[TcpSettings], host: HostTcp) -> None:
    """Refuse, before anything exists, a congestion control this kernel lacks."""
    for s in settings:
        cc = s.congestion_control
        if cc and host.available and cc not in host.available:
            raise TcpSettingsError(
                f"tcp congestion_control = {cc!r} is not in this kernel (its "
                f"tcp_available_congestion_control: {', '.join(host.available)}); pick one of "
                "those")


def effective(settings: TcpSettings, host: HostTcp) -> dict:
    """What a worker namespace ends up with under ``settings`` (for the record and the
    simulator): the namespace inherits the host's congestion control and starts with idle
    restart on and the kernel's buffer defaults."""
    netns_rmem = settings.rmem_max_bytes or (host.rmem[-1] if host.rmem else 0)
    netns_wmem = settings.wmem_max_bytes or (host.wmem[-1] if host.wmem else 0)
    ssai = settings.slow_start_after_idle
    return {"congestion_control": settings.congestion_control or host.congestion_control,
            "slow_start_after_idle": NETNS_DEFAULT_SSAI if ssai < 0 else ssai,
            "rmem_max_bytes": netns_rmem, "wmem_max_bytes": netns_wmem,
            "init_cwnd": settings.init_cwnd or 10,
            # only where a link sets one (time dilation does): the record of any other run
            # stays as it was; the kernel's is KERNEL_RTO_MIN_MS
            **({"rto_min_ms": settings.rto_min_ms} if settings.rto_min_ms else {})}


# ---------------------------------------------------------------- commands

def sysctl_writes(settings: TcpSettings, host: HostTcp) -> list[tuple[str, str]]:
    """(name under /proc/sys/net/ipv4, value) to write in a sender's namespace."""
    out = []
    if settings.slow_start_after_idle >= 0:
        out.append(("tcp_slow_start_after_idle", str(settings.slow_start_after_idle)))
    for name, value, base in (("tcp_rmem", settings.rmem_max_bytes, host.rmem),
                              ("tcp_wmem", settings.wmem_max_bytes, host.wmem)):
        if value:
            lo, mid = (base[0], base[1]) if len(base) == 3 else (4096, 131072)
            out.append((name, f"{lo} {min(mid, value)} {value}"))
    return out


def check_one_sender(rank: int, per_link: Mapping[int, TcpSettings]) -> None:
    """Idle restart and buffers are per namespace, so one sender's links must agree on them."""
    seen = {(s.slow_start_after_idle, s.rmem_max_bytes, s.wmem_max_bytes)
            for s in per_link.values()}
    if len(seen) > 1:
        raise TcpSettingsError(
            f"worker {rank}'s links ask for different slow_start_after_idle or buffer sizes "
            f"({sorted(seen)}); these are per network namespace (the sender's), so set them "
            "per worker: the same on every link leaving a worker")
