"""A userspace packet delay line: the switch of the emulated network, for kernels without netem.

    ip netns exec gl<run>-sw python -m netem.packetline SPEC.json

It runs inside the switch namespace in place of the bridge: the ports ``p<k>`` (the switch ends
of the workers' veths) are up but enslaved to nothing, and this process moves every frame
between them. IPv4 frames go to the port of their destination address after the directed
link's rules (``netem.impair``: delay, jitter, reordering, loss, queue) have decided, so TCP's
segments and its ACKs are really delayed, jittered and lost before any TCP sees them: the
senders' congestion control, ACK clocking and timers see the emulated path.

How it reads and writes frames
------------------------------
One ``AF_PACKET``/``SOCK_RAW`` socket per port, bound to the port with ``ETH_P_ALL``:

- ``PACKET_IGNORE_OUTGOING``: the socket does not see what this process (or the port's own
  IPv6 neighbour discovery) transmits on the port, only what the worker sent.
- ``PACKET_VNET_HDR`` on receive and send (net/packet/af_packet.c, ``packet_rcv_vnet`` and
  ``packet_snd_vnet_parse``; include/linux/virtio_net.h). A veth carries TCP's GSO
  super-packets (up to 64 KiB, many wire packets) whose checksums are left for "the device" to
  fill in (CHECKSUM_PARTIAL: the TCP checksum field holds only the pseudo-header's sum). Each
  frame comes with a 10-byte ``struct virtio_net_hdr`` that says so (GSO type and size, where
  the checksum starts); sent back unchanged it gives the kernel the same skb: it accepts a
  frame larger than the MTU and the receiving TCP gets correct checksums. Without it (measured
  on this kernel, 6.18) the raw copy of a SYN reaches the receiver with a wrong checksum and is
  dropped, and a GSO frame longer than the MTU is refused with EMSGSIZE: nothing connects.
- ``SO_TIMESTAMPNS``: the kernel stamps each frame when the port received it (CLOCK_REALTIME,
  in the ancillary data of ``recvmsg``), so a frame read late is not delayed more: its release
  time is computed from the stamp.

Forwarding
----------
- IPv4 unicast: by destination address (``198.18.H.L`` -> its rank) to that rank's port; the
  link is (the rank of the port it came in on, that rank). Unknown destinations and frames
  that would go back out of their own port are dropped (counted).
- ARP, broadcast and multicast frames, and every non-IPv4 frame (IPv6 neighbour discovery),
  are flooded to the other ports at once, undelayed: a WAN has no ARP across it, it resolves
  next hops on each LAN, so ARP is no traffic of the emulated links; delaying it would only
  hold the first packet of every flow for a resolution that a routed path does not do. The
  data plane must be IPv4: IPv6 would cross unimpaired.
- Never trusted: frames too short, or with a malformed IPv4 header, are counted and dropped,
  and nothing in a frame can stop the loop.

GSO and loss
------------
A GSO super-packet is many wire packets: losing it as one unit would lose tens of consecutive
segments, which no real link does and which TCP recovers from very differently. Loss is decided
per segment (``LinkLine.admit_gso``). When none is lost (at 1 % loss, ~2/3 of 44-segment
frames) the frame leaves whole; otherwise a TCP/IPv4 frame is cut into its segments here, as
the kernel's tcp_gso_segment would (sequence numbers, IP ids, FIN/PSH on the last segment only,
CWR on the first only, full IP and TCP checksums in software), and only the survivors are sent.
Other GSO types (UDP GSO, IPv6) are decided as one unit (rare on this data plane; counted as
``gso_unsplit``). The survivors of one frame share one delay draw (one burst on the wire).

Engines
-------
Two implementations of the loop, the same rules and the same stats; the ready file and the
stats say which ran (``"engine": "c" | "python"``), the spec's ``engine`` picks it (``auto``,
the default and what a spec without the field means: the compiled one where it was built, or
what the environment's ``NETEM_PACKETLINE_ENGINE`` names):

- ``c``: ``netem/_linecore.c`` (built by ``pip install``; setup.py marks it optional, so a
  machine without a compiler installs and runs ``python``). It reads up to 64 frames per
  ``recvmmsg`` call, parses and routes them, decides every link whose impairment is a plain
  fixed delay itself (LinkLine's arithmetic for delay, FIFO order, queue limits and the global
  budget, tested equal to LinkLine's on the same frames: tests/unit/test_linecore.py), holds
  every release in one heap, sends what is due with one ``sendmmsg`` per port and waits with
  ``epoll_pwait2`` (nanosecond timeout). Frames of links with random draws (loss, jitter,
  reordering, Gilbert-Elliott) are handed to Python, whose LinkLine decides them with today's
  seeded draws (and cuts a GSO frame that loses segments); the core then holds and sends them.
- ``python``: the loop below, kept for machines without the extension and for side-by-side
  benchmarks.

Timing (the ``python`` engine)
------------------------------
One event loop: epoll over the port sockets, the control pipe (stdin) and a signal pipe, and a
heap of due releases. epoll's timeout is whole milliseconds (rounded up), so the loop wakes
up to a millisecond early and sleeps the rest with ``time.sleep`` (a high-resolution timer;
the timer slack is set to 1 us). Each release's lateness (actual send - scheduled release) is
recorded; the stats give its p50/p99/max. Automatic garbage collection is off (the loop builds
no reference cycles), so no collector pause delays a release.

Memory is bounded: each link's queue (``Impairment.queue_limits``, tail drop) and a global cap
over every link (``PacketLineSpec.global_limit_bytes``, default 256 MiB, counting a 256-byte
cost per held frame for the objects around its bytes).

Host settings
-------------
- Each port socket asks for a 32 MiB receive buffer. SO_RCVBUFFORCE needs CAP_NET_ADMIN in the
  initial user namespace, so inside the launcher's user namespace the kernel caps the buffer
  at 2 x net.core.rmem_max, a host-wide sysctl (4 MiB on this machine kind, so 8 MiB; many
  distributions ship 208 KiB, which holds only a few 64 KiB GSO frames). Frames lost there
  are counted per port (``socket_drops`` in the stats, PACKET_STATISTICS); raise rmem_max on
  the host where they are not zero. ``rcvbuf_bytes`` in the ready file says what was granted.
- Long delays need TCP windows of the bandwidth-delay product in the worker namespaces
  (net.ipv4.tcp_rmem / tcp_wmem maximum, per namespace): 200 Mbit/s over 2 x 50 ms is 2.5 MB.
- Nothing is needed in the switch namespace: it forwards nothing itself (no address on the
  ports, ip_forward off), so frames for the workers go only through this process.

Measured on this machine kind (2 cores, ``benchmarks/bench_packetline.py --engines c,python``,
10 ms each way, a 1 kHz UDP probe through the same line; the machine was shared with other
test runs, so the tails are the CPU's as much as the line's). Small frames (60 bytes, no
GSO, 2 sender processes): the ``c`` engine forwarded 150,000 frames/s when offered 150,000
and 245,000-290,000 frames/s when offered all the senders could (at 0.6-0.95 of a core, most of
it in the kernel's send path); the ``python`` engine 14,000-60,000 (it falls behind: lateness
p50 0.3-0.7 s). At 150,000 frames/s the ``c`` engine's one-way delay error was p50 0.05 ms but
p99 4.2 ms (release lateness p99 6.8 ms): frames waited for the line in its sockets (read lag
p99 14 ms) while the senders took the other core. Shaped TCP (1x200, 4x250 Mbit/s): error p99
0.22-0.31 ms (``c``) vs 0.34-0.45 ms (``python``), at a fifth to a third of the CPU. With 2
busy-loop processes beside the line (``--load 2``), real-time priority is what keeps it on
time: 1x200 Mbit/s at normal priority had error p99 4.8 ms (``c``) and 377 ms (``python``),
at ``chrt -f 10`` 0.19 ms (``c``, lateness p99 0.15 ms) and 0.68 ms (``python``).

Control and files
-----------------
stdin takes JSON lines; each gets one JSON line on stdout:

- ``{"op": "set", "src": 0, "dst": 1, "delay_ms": 20, ...}``: change fields of one link's
  impairment live (the rest stay); what is held keeps its release time.
- ``{"op": "stats"}``: write the stats file now (the reply carries them too).
- ``{"op": "lateness"}``: the release lateness and read lag alone (and ``since_mark``), no
  links and no file: what a live fidelity verdict asks once a second. The line forwards no
  frame while it answers, and a whole stats op (every link's counters, the file) held
  frames for milliseconds: an 8-worker run that asked it once a second read p99 lateness of
  3-9.5 ms where one that did not read 1.1 ms.
- ``{"op": "mark"}``: from now on the stats also carry ``since_mark``: the lateness and read
  lag of the frames after this point alone (a run marks the start of training, so that its
  pre-run probe's bulk flows are not judged as training's).

EOF on stdin means the parent is gone: write stats and exit 0; so do SIGTERM and SIGINT. The
process also dies with its parent (PR_SET_PDEATHSIG). ``ready_path`` is written (atomically)
once every socket is open; ``stats_path`` at exit and on request (atomically).

Not done: correlation of the random draws (netem's ``delay 10ms 2ms 25%``), duplication,
corruption, a rate (the workers' HTB shapes), IPv6.
"""
from __future__ import annotations

import bisect
import contextlib
import ctypes
import errno
import gc
import heapq
import ipaddress
import itertools
import json
import math
import operator
import os
import re
import select
import signal
import socket
import stat
import struct
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from netem.impair import ByteBudget, Impairment, ImpairmentError, LinkLine

SPEC_VERSION = 1

# linux/socket.h, linux/if_packet.h, linux/if_ether.h, linux/prctl.h
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
PACKET_STATISTICS = 6
TPACKET_STATS = struct.Struct("=II")  # struct tpacket_stats: tp_packets, tp_drops
SO_TIMESTAMPNS = 35                  # SCM_TIMESTAMPNS: struct timespec, CLOCK_REALTIME
SO_SNDBUFFORCE = 32
SO_RCVBUFFORCE = 33
ETH_P_ALL = 0x0003
PR_SET_PDEATHSIG = 1
PR_SET_TIMERSLACK = 29

# include/uapi/linux/virtio_net.h
VNET_HDR = struct.Struct("<BBHHHH")  # flags, gso_type, hdr_len, gso_size, csum_start, csum_offset
VNET_LEN = VNET_HDR.size             # 10
GSO_NONE, GSO_TCPV4 = 0, 1
GSO_ECN = 0x80
NO_OFFLOAD_VNET = bytes(VNET_LEN)    # complete checksums, no GSO

ETH_LEN = 14
IPV4_MIN_LEN = 20
ETHERTYPE_IPV4 = b"\x08\x00"
TIMESPEC = struct.Struct("=qq")
TCP_FIN, TCP_PSH, TCP_CWR = 0x01, 0x08, 0x80

RECV_BUF_BYTES = 256 * 1024          # a 64 KiB GSO frame and then some
ANC_BUF_BYTES = socket.CMSG_SPACE(TIMESPEC.size)
SOCK_BUF_BYTES = 32 << 20            # asked for; the kernel caps it at net.core.[rw]mem_max x 2
BATCH_FRAMES = 64                    # frames read from one socket per wakeup before releasing
WAKE_EARLY_S = 0.0002                # epoll wakes this much before a release at least
DEFAULT_GLOBAL_LIMIT_BYTES = 256 << 20
PER_FRAME_COST_BYTES = 256
TIMER_SLACK_NS = 1000

DEV_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")   # IFNAMSIZ 16 with the NUL
ENGINES = ("auto", "c", "python")    # auto: the compiled core where it was built, else Python
ENGINE_ENV = "NETEM_PACKETLINE_ENGINE"   # what 'auto' means in this environment, if set

try:
    from netem import _linecore
except ImportError:                  # built without a compiler: the pure-Python loop only
    _linecore = None


def engine_available() -> bool:
    """Whether the compiled core (netem/_linecore.c) was built and imports."""
    return _linecore is not None


class SpecError(ValueError):
    """A packet line spec is malformed or names a value out of range."""


# ---------------------------------------------------------------- the spec

class Port(NamedTuple):
    """One switch port: the worker's rank, the port device (``p<k>``), the worker's IPv4."""

    rank: int
    dev: str
    address: str


def _check_port(p: Any) -> Port:
    if not isinstance(p, (list, tuple)) or len(p) != 3:
        raise SpecError(f"port {p!r} is not [rank, dev, ipv4 address]")
    rank, dev, address = p
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= 65_534:
        raise SpecError(f"port rank = {rank!r} is out of range; expected an integer in "
                        "[0, 65534]")
    if not isinstance(dev, str) or not DEV_RE.match(dev):
        raise SpecError(f"port dev = {dev!r} is not a device name (1-15 of [A-Za-z0-9_.:-])")
    try:
        ipaddress.IPv4Address(address)
    except (ipaddress.AddressValueError, ValueError, TypeError):
        raise SpecError(f"port address = {address!r} is not an IPv4 address") from None
    return Port(rank, dev, str(address))


def _unique(what: str, values: list) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise SpecError(f"port {what} {v!r} appears twice; every port needs its own")
        seen.add(v)


@dataclass(frozen=True)
class PacketLineSpec:
    """What one packet line forwards: its ports, the impairment of each directed link (links
    not listed get ``default``), the seed of every link's draws, and where its files go."""

    ports: tuple[Port, ...]
    links: Mapping[tuple[int, int], Impairment] = field(default_factory=dict)
    default: Impairment = Impairment()
    seed: int = 0
    stats_path: str | None = None
    ready_path: str | None = None
    global_limit_bytes: int = DEFAULT_GLOBAL_LIMIT_BYTES
    engine: str = "auto"
    version: int = SPEC_VERSION

    def __post_init__(self) -> None:
        if self.version != SPEC_VERSION:
            raise SpecError(f"version = {self.version!r} is not supported; expected "
                            f"{SPEC_VERSION}")
        ports = tuple(_check_port(p) for p in self.ports)
        if not ports:
            raise SpecError("ports = [] is empty; a packet line needs at least one port")
        object.__setattr__(self, "ports", ports)
        for what, i in (("rank", 0), ("dev", 1), ("address", 2)):
            _unique(what, [p[i] for p in ports])
        object.__setattr__(self, "links", dict(self.links))
        ranks = {p.rank for p in ports}
        for key, imp in self.links.items():
            self._check_link(key, imp, ranks)
        if not isinstance(self.default, Impairment):
            raise SpecError(f"default = {self.default!r} is not an Impairment")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SpecError(f"seed = {self.seed!r} is not an integer")
        for name in ("stats_path", "ready_path"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise SpecError(f"{name} = {value!r} is not a path (a non-empty string or null)")
        g = self.global_limit_bytes
        if isinstance(g, bool) or not isinstance(g, int) or not (1 << 20) <= g <= (1 << 40):
            raise SpecError(f"global_limit_bytes = {g!r} is out of range; expected an integer "
                            f"in [{1 << 20}, {1 << 40}]")
        if self.engine not in ENGINES:
            raise SpecError(f"engine = {self.engine!r} is not allowed; expected one of "
                            f"{', '.join(ENGINES)}")

    def engine_to_run(self) -> str:
        """'c' or 'python': what ``engine`` picks on this installation; a SpecError when 'c'
        is asked for and the compiled core is not built."""
        if self.engine == "c" and _linecore is None:
            raise SpecError("engine = 'c' is not possible here: netem._linecore is not built "
                            "(reinstall with a C compiler); expected 'auto' or 'python'")
        engine = self.engine
        if engine == "auto":
            # the environment may pick for a spec that does not (side-by-side runs, tests)
            engine = os.environ.get(ENGINE_ENV, "auto")
            if engine not in ENGINES:
                raise SpecError(f"{ENGINE_ENV} = {engine!r} is not allowed; expected one of "
                                f"{', '.join(ENGINES)}")
            if engine == "c" and _linecore is None:
                raise SpecError(f"{ENGINE_ENV} = 'c' is not possible here: netem._linecore "
                                "is not built (reinstall with a C compiler)")
        if engine == "auto":
            return "c" if _linecore is not None else "python"
        return engine

    @staticmethod
    def _check_link(key: Any, imp: Any, ranks: set[int]) -> None:
        if not isinstance(key, tuple) or len(key) != 2 or not all(k in ranks for k in key):
            raise SpecError(f"link {key!r} is not a pair of port ranks (ports have "
                            f"{sorted(ranks)})")
        if key[0] == key[1]:
            raise SpecError(f"link {key!r} goes from a port to itself")
        if not isinstance(imp, Impairment):
            raise SpecError(f"link {key!r}: {imp!r} is not an Impairment")

    def impairment(self, src: int, dst: int) -> Impairment:
        return self.links.get((src, dst), self.default)

    # -- JSON

    def to_json(self) -> dict:
        return {"version": self.version,
                "ports": [list(p) for p in self.ports],
                "links": [{"src": s, "dst": d, "impairment": imp.to_json()}
                          for (s, d), imp in sorted(self.links.items())],
                "default": self.default.to_json(),
                "seed": self.seed, "stats_path": self.stats_path,
                "ready_path": self.ready_path, "global_limit_bytes": self.global_limit_bytes,
                "engine": self.engine}

    @classmethod
    def from_json(cls, data: Any) -> PacketLineSpec:
        if not isinstance(data, dict):
            raise SpecError(f"a packet line spec is a JSON object, not {type(data).__name__}")
        known = {"version", "ports", "links", "default", "seed", "stats_path", "ready_path",
                 "global_limit_bytes", "engine"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"unknown spec field(s) {', '.join(unknown)}; expected some of "
                            f"{', '.join(sorted(known))}")
        if "ports" not in data:
            raise SpecError("the spec has no ports")
        try:
            links = {_link_key(e): Impairment.from_json(e.get("impairment", {}))
                     for e in _list("links", data.get("links", []))}
            default = Impairment.from_json(data.get("default", {}))
        except ImpairmentError as exc:
            raise SpecError(str(exc)) from None
        return cls(ports=tuple(_list("ports", data["ports"])), links=links, default=default,
                   seed=data.get("seed", 0), stats_path=data.get("stats_path"),
                   ready_path=data.get("ready_path"),
                   global_limit_bytes=data.get("global_limit_bytes",
                                               DEFAULT_GLOBAL_LIMIT_BYTES),
                   engine=data.get("engine", "auto"), version=data.get("version", SPEC_VERSION))

    def save(self, path: str) -> None:
        write_atomically(path, self.to_json())

    @classmethod
    def load(cls, path: str) -> PacketLineSpec:
        with open(path, encoding="utf-8") as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as exc:
                raise SpecError(f"{path} is not JSON: {exc}") from None
        return cls.from_json(data)


def _list(what: str, value: Any) -> list:
    if not isinstance(value, list):
        raise SpecError(f"{what} = {value!r} is not a list")
    return value


def _link_key(entry: Any) -> tuple[int, int]:
    if not isinstance(entry, dict) or "src" not in entry or "dst" not in entry:
        raise SpecError(f"link {entry!r} is not an object with src, dst and impairment")
    return entry["src"], entry["dst"]


def spec_for_topology(topo: Any, links: Mapping[tuple[int, int], Impairment] | None = None,
                      **kw: Any) -> PacketLineSpec:
    """The spec of a ``netem.commands.NetTopology``: port ``p<k>`` and address of every
    worker; ``kw`` are the other PacketLineSpec fields."""
    ports = tuple(Port(k, topo.port_dev(k), topo.address(k)) for k in range(topo.workers))
    return PacketLineSpec(ports=ports, links=dict(links or {}), **kw)


def write_atomically(path: str, obj: Any) -> None:
    """Write JSON to a temporary file next to ``path``, then rename it into place."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------- frames (pure)

def ones_sum(data: bytes) -> int:
    """The 16-bit one's complement sum of ``data`` (RFC 1071), zero-padded to even length.

    2^16 = 1 modulo 2^16 - 1, so the sum of the 16-bit words of a big-endian number is the
    number itself modulo 0xffff (with 0xffff standing for a non-zero multiple): one C-speed
    ``int.from_bytes`` instead of a loop over words.
    """
    if len(data) & 1:
        data = bytes(data) + b"\x00"
    n = int.from_bytes(data, "big")
    s = n % 0xFFFF
    return 0xFFFF if s == 0 and n else s


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``, as it goes into a header."""
    return ~ones_sum(data) & 0xFFFF


class FrameInfo(NamedTuple):
    """What the line needs of one IPv4 frame (offsets count the virtio header)."""

    dst_ip: bytes
    ip_off: int
    l4_off: int
    proto: int


def parse_ipv4(frame: bytes) -> FrameInfo | None:
    """The IPv4 header of a vnet-header-prefixed Ethernet frame; None when malformed."""
    ip_off = VNET_LEN + ETH_LEN
    if len(frame) < ip_off + IPV4_MIN_LEN:
        return None
    vihl = frame[ip_off]
    ihl = (vihl & 0x0F) * 4
    if vihl >> 4 != 4 or ihl < IPV4_MIN_LEN or len(frame) < ip_off + ihl:
        return None
    return FrameInfo(frame[ip_off + 16:ip_off + 20], ip_off, ip_off + ihl, frame[ip_off + 9])


def gso_segments(frame: bytes, info: FrameInfo) -> tuple[int, int] | None:
    """(segments, header bytes up to the payload) of a GSO frame, None when inconsistent."""
    _, gso_type, _, gso_size, _, _ = VNET_HDR.unpack_from(frame)
    if gso_size == 0:
        return None
    hdr_end = info.l4_off
    if gso_type & ~GSO_ECN == GSO_TCPV4:
        if info.proto != socket.IPPROTO_TCP or len(frame) < info.l4_off + 20:
            return None
        hdr_end += (frame[info.l4_off + 12] >> 4) * 4
    elif info.proto == socket.IPPROTO_UDP:
        hdr_end += 8
    if hdr_end > len(frame) or (gso_type & ~GSO_ECN == GSO_TCPV4 and hdr_end < info.l4_off + 20):
        return None
    payload = len(frame) - hdr_end
    return max(1, -(-payload // gso_size)), hdr_end


def segment_tcp4(frame: bytes, info: FrameInfo, hdr_end: int,
                 keep: Iterable[int]) -> list[bytes]:
    """The segments ``keep`` (indices) of a TCP/IPv4 GSO frame, as the kernel's GSO would cut
    them (net/ipv4/tcp_offload.c tcp_gso_segment, net/ipv4/af_inet.c inet_gso_segment): each
    carries gso_size bytes of payload (the last the rest), seq advanced by that, the IP id
    incremented per segment, FIN and PSH only on the last, CWR only on the first; both
    checksums complete (RFC 791, RFC 793 pseudo-header), so the virtio header says no offload.
    """
    mss = VNET_HDR.unpack_from(frame)[3]
    ip_off, l4_off = info.ip_off, info.l4_off
    eth = frame[VNET_LEN:ip_off]
    ip0, tcp0 = frame[ip_off:l4_off], frame[l4_off:hdr_end]
    payload = memoryview(frame)[hdr_end:]
    count = max(1, -(-len(payload) // mss))
    ip_id0 = int.from_bytes(ip0[4:6], "big")
    seq0 = int.from_bytes(tcp0[4:8], "big")
    pseudo_addrs = ip0[12:20]
    out = []
    for i in sorted(set(keep)):
        if not 0 <= i < count:
            continue
        data = bytes(payload[i * mss:(i + 1) * mss])
        ip = bytearray(ip0)
        ip[2:4] = (len(ip0) + len(tcp0) + len(data)).to_bytes(2, "big")
        ip[4:6] = ((ip_id0 + i) & 0xFFFF).to_bytes(2, "big")
        ip[10:12] = b"\x00\x00"
        ip[10:12] = checksum(ip).to_bytes(2, "big")
        tcp = bytearray(tcp0)
        tcp[4:8] = ((seq0 + i * mss) & 0xFFFFFFFF).to_bytes(4, "big")
        if i != count - 1:
            tcp[13] &= ~(TCP_FIN | TCP_PSH) & 0xFF
        if i != 0:
            tcp[13] &= ~TCP_CWR & 0xFF
        tcp[16:18] = b"\x00\x00"
        seg_len = len(tcp) + len(data)
        pseudo = pseudo_addrs + bytes((0, socket.IPPROTO_TCP)) + seg_len.to_bytes(2, "big")
        tcp[16:18] = checksum(pseudo + tcp + data).to_bytes(2, "big")
        out.append(NO_OFFLOAD_VNET + eth + bytes(ip) + bytes(tcp) + data)
    return out


# ---------------------------------------------------------------- lateness (pure)

def _last_nonzero(bins: list[int]) -> int:
    """The index of the last bin that is not zero (``bins`` has one)."""
    return len(bins) - 1 - next(i for i, n in enumerate(reversed(bins)) if n)


class Histogram:
    """Bounded record of durations (seconds): 1 us bins up to 10 ms, 100 us bins up to 1 s,
    the maximum kept exactly. Percentiles are bin upper edges (at most one bin high)."""

    FINE_S, FINE_BINS = 1e-6, 10_000
    COARSE_S, COARSE_BINS = 1e-4, 10_000

    def __init__(self) -> None:
        self.fine = [0] * self.FINE_BINS
        self.coarse = [0] * self.COARSE_BINS
        self.over = 0
        self.count = 0
        self.max_s = 0.0

    def add(self, value_s: float) -> None:
        v = value_s if value_s > 0 else 0.0
        self.count += 1
        if v > self.max_s:
            self.max_s = v
        i = int(v / self.FINE_S)
        if i < self.FINE_BINS:
            self.fine[i] += 1
            return
        j = int(v / self.COARSE_S)
        if j < self.COARSE_BINS:
            self.coarse[j] += 1
        else:
            self.over += 1

    @classmethod
    def from_bins(cls, fine: list, coarse: list, over: int, count: int,
                  max_s: float) -> Histogram:
        """The compiled core's histogram (the same bins), to summarise with these rules."""
        h = cls()
        h.fine, h.coarse, h.over, h.count, h.max_s = list(fine), list(coarse), over, count, max_s
        return h

    def percentile_s(self, q: float) -> float:
        """The q-quantile (0 < q <= 1); 0 when empty."""
        return self._percentiles_s((q,))[0]

    def _percentiles_s(self, qs: tuple[float, ...]) -> list[float]:
        """Quantiles from one pass of cumulative sums in C (accumulate, bisect): the line
        answers a stats op between frames, and a Python loop over 20,000 bins per quantile
        held every frame for milliseconds."""
        if not self.count:
            return [0.0 for _ in qs]
        fine = list(itertools.accumulate(self.fine))
        coarse = None   # summed only for a quantile past the fine bins (rare: lateness > 10 ms)
        out = []
        for q in qs:
            rank = max(1, math.ceil(q * self.count))
            if fine[-1] >= rank:
                edge = (bisect.bisect_left(fine, rank) + 1) * self.FINE_S
            else:
                if coarse is None:
                    coarse = list(itertools.accumulate(self.coarse, initial=fine[-1]))[1:]
                edge = ((bisect.bisect_left(coarse, rank) + 1) * self.COARSE_S
                        if coarse[-1] >= rank else self.max_s)
            out.append(min(self.max_s, edge))
        return out

    def copy(self) -> Histogram:
        return type(self).from_bins(self.fine, self.coarse, self.over, self.count, self.max_s)

    def since(self, earlier: Histogram) -> Histogram:
        """What was added after ``earlier`` (a copy of this one taken then): the bins'
        differences; the maximum is the upper edge of the highest bin that grew (at most one
        bin high, and never above the whole maximum)."""
        h = type(self)()
        if len(earlier.fine) != len(self.fine) or len(earlier.coarse) != len(self.coarse):
            raise ValueError("histograms of different bins")
        h.fine = list(map(operator.sub, self.fine, earlier.fine))
        h.coarse = list(map(operator.sub, self.coarse, earlier.coarse))
        h.over, h.count = self.over - earlier.over, self.count - earlier.count
        if h.over:
            h.max_s = self.max_s
        elif any(h.coarse):
            h.max_s = min(self.max_s, (_last_nonzero(h.coarse) + 1) * self.COARSE_S)
        elif any(h.fine):
            h.max_s = min(self.max_s, (_last_nonzero(h.fine) + 1) * self.FINE_S)
        return h

    def summary_ms(self) -> dict:
        p50_s, p99_s = self._percentiles_s((0.5, 0.99))
        return {"count": self.count,
                "p50_ms": round(p50_s * 1e3, 4),
                "p99_ms": round(p99_s * 1e3, 4),
                "max_ms": round(self.max_s * 1e3, 4)}


# ---------------------------------------------------------------- the process

def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (also by kill -9), and a fine timer slack."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        libc.prctl(PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _set_buffer(sock: socket.socket, force: int, plain: int, size: int) -> None:
    """SO_*BUFFORCE needs CAP_NET_ADMIN in the initial user namespace; else the plain option,
    which the kernel caps at net.core.[rw]mem_max (a global sysctl) and doubles."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, force, size)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, plain, size)


def open_port(dev: str) -> socket.socket:
    """A raw packet socket on ``dev``: every frame the worker sent, with its virtio header and
    the kernel's receive timestamp; not the ones we send."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)   # 0: receives nothing yet
    try:
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        _set_buffer(sock, SO_RCVBUFFORCE, socket.SO_RCVBUF, SOCK_BUF_BYTES)
        _set_buffer(sock, SO_SNDBUFFORCE, socket.SO_SNDBUF, SOCK_BUF_BYTES)
        sock.bind((dev, ETH_P_ALL))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _arrival_s(ancdata: list, fallback_s: float) -> tuple[float, bool]:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            return sec + nsec * 1e-9, True
    return fallback_s, False


FRAME_COUNTERS = ("received", "forwarded_frames", "flooded", "malformed", "truncated",
                  "recv_errors", "unroutable", "hairpin", "no_timestamp", "send_errors",
                  "gso_frames", "gso_split", "gso_unsplit", "control_errors",
                  "replies_dropped")
# Replies the reader has not taken yet are kept, whole lines only, up to this; past it a new
# reply is dropped whole (counted in replies_dropped) rather than growing without bound.
REPLY_BUF_LIMIT_BYTES = 64 << 20
CLOSE_FLUSH_S = 2.0                  # at exit, how long unread replies may wait for the reader


def is_plain(imp: Impairment) -> bool:
    """A fixed delay only (no loss, jitter or reordering): the compiled core decides it."""
    return not (imp.lossy or imp.jitter_ms or imp.reorders)


class _CoreBudget:
    """The global budget as the compiled core keeps it, for the LinkLines Python decides (what
    LinkLine asks of a ByteBudget): they take from the core's count; the core gives back itself
    when it sends (one frame's cost, as LinkLine.released would), so give is nothing here."""

    def __init__(self, core: Any, limit_bytes: int, per_pkt_bytes: int):
        self._core, self.limit_bytes, self.per_pkt_bytes = core, limit_bytes, per_pkt_bytes

    def take(self, size_bytes: int, frames: int = 1) -> bool:
        return self._core.budget_take(size_bytes + (frames - 1) * self.per_pkt_bytes)

    def give(self, size_bytes: int, frames: int = 1) -> None:
        pass

    @property
    def held_bytes(self) -> int:
        return self._core.budget()[0]

    @property
    def refused(self) -> int:
        return self._core.budget()[1]


class _CoreEpoll:
    """What the loop registers (control, signal and reply fds), watched by the core's epoll."""

    def __init__(self, core: Any):
        self._core = core

    def register(self, fd: int, events: int) -> None:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise PermissionError(errno.EPERM, "a regular file cannot be polled")
        self._core.watch(fd, events)

    def unregister(self, fd: int) -> None:
        self._core.unwatch(fd)

    def close(self) -> None:
        pass


class PacketLine:
    """The forwarder: ``open()`` the ports, ``run()`` until EOF on the control fd or a signal.

    ``clock``: CLOCK_REALTIME in seconds (the kernel's receive stamps are on it)."""

    def __init__(self, spec: PacketLineSpec, clock: Callable[[], float] = time.time,
                 control_fd: int | None = 0, reply: Callable[[dict], None] | None = None,
                 reply_fd: int = 1):
        self.spec, self.clock = spec, clock
        self.control_fd = control_fd
        self.reply = reply or self._queue_reply
        self.reply_fd = reply_fd
        self._out = bytearray()          # reply bytes the pipe has not taken yet
        self._out_watched = False
        self.budget = ByteBudget(spec.global_limit_bytes, PER_FRAME_COST_BYTES)
        self.route = {socket.inet_aton(p.address): p.rank for p in spec.ports}
        self.impairments: dict[tuple[int, int], Impairment] = dict(spec.links)
        self.lines: dict[tuple[int, int], LinkLine] = {}
        self.socks: dict[int, socket.socket] = {}
        self.rank_of_fd: dict[int, int] = {}
        self.heap: list = []
        self.seq = 0
        self.counts = dict.fromkeys(FRAME_COUNTERS, 0)
        self.send_errnos: dict[str, int] = {}
        self.late = Histogram()          # actual send - scheduled release
        self.lag = Histogram()           # our read - the kernel's receive stamp
        self._mark: tuple | None = None  # (late, lag, at) at the last "mark": training starts
        self.stop_reason: str | None = None
        self.started_s = clock()
        self._buf = bytearray(RECV_BUF_BYTES)
        self._view = memoryview(self._buf)
        self._control_tail = b""
        self._control_drains = True
        self.kernel_drops: dict[int, int] = {}
        self._epoll: select.epoll | _CoreEpoll | None = None
        self._wake_r = self._wake_w = -1
        self.engine = spec.engine_to_run()
        self.core: Any = None            # the compiled core, once open() with engine 'c'
        self.index_of_rank: dict[int, int] = {}
        self._plain: set[tuple[int, int]] = set()   # links the core decides

    # -- set-up

    def open(self) -> None:
        for p in self.spec.ports:
            sock = open_port(p.dev)
            self.socks[p.rank] = sock
            self.rank_of_fd[sock.fileno()] = p.rank
        if self.engine == "c":
            self.start_core()
        else:
            self._epoll = select.epoll()
            for fd in self.rank_of_fd:
                self._epoll.register(fd, select.EPOLLIN)
        self._open_control()
        if self.spec.ready_path:
            some = next(iter(self.socks.values()))
            write_atomically(self.spec.ready_path,
                             {"version": SPEC_VERSION, "pid": os.getpid(),
                              "ports": [list(p) for p in self.spec.ports],
                              "rcvbuf_bytes": some.getsockopt(socket.SOL_SOCKET,
                                                              socket.SO_RCVBUF),
                              "engine": self.engine, "time_s": self.clock()})

    def start_core(self, fds: list[int] | None = None) -> None:
        """The compiled core over the port sockets (``fds`` by port order: tests pass their
        own); it reads, routes and releases, and hands Python the frames of other links."""
        ports = self.spec.ports
        self.index_of_rank = {p.rank: i for i, p in enumerate(ports)}
        if fds is None:
            fds = [self.socks[p.rank].fileno() for p in ports]
        self.core = _linecore.Core(fds, [socket.inet_aton(p.address) for p in ports],
                                   self.spec.global_limit_bytes, PER_FRAME_COST_BYTES)
        self.budget = _CoreBudget(self.core, self.spec.global_limit_bytes,
                                  PER_FRAME_COST_BYTES)
        self._epoll = _CoreEpoll(self.core)
        for key, line in self.lines.items():     # links made before (a set): the core's now
            line.budget = self.budget
            self._core_link(key, line.impairment, line)

    def _open_control(self) -> None:
        if self.control_fd is None:
            return
        mode = os.fstat(self.control_fd).st_mode
        # a pipe or socket is read until empty; a terminal is left blocking (it is shared
        # with the shell) and read once per wake-up
        self._control_drains = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
        if self._control_drains:
            os.set_blocking(self.control_fd, False)
        try:
            self._epoll.register(self.control_fd, select.EPOLLIN)
        except PermissionError:          # a regular file cannot be polled: read it, then EOF
            self._read_control()

    def install_signals(self) -> None:
        """SIGTERM/SIGINT wake the loop through a pipe and stop it cleanly."""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        signal.set_wakeup_fd(self._wake_w)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self._epoll.register(self._wake_r, select.EPOLLIN)

    def _on_signal(self, signum, frame) -> None:
        self.stop_reason = signal.Signals(signum).name

    def line(self, src: int, dst: int) -> LinkLine:
        key = (src, dst)
        line = self.lines.get(key)
        if line is None:
            imp = self.impairments.get(key, self.spec.default)
            line = LinkLine(imp, self.spec.seed, src, dst, budget=self.budget)
            self.lines[key] = line
            if self.core is not None:
                self._core_link(key, imp, line)
        return line

    def _core_link(self, key: tuple[int, int], imp: Impairment, line: LinkLine) -> None:
        """Tell the core who decides the link. A link the core decided and that now draws at
        random hands its state to its LinkLine first; one Python decided stays Python's (its
        LinkLine holds the state)."""
        plain = is_plain(imp) and (key in self._plain or line.counters.admitted_pkts == 0)
        si, di = self.index_of_rank[key[0]], self.index_of_rank[key[1]]
        if key in self._plain and not plain:
            st = self.core.link_state(si, di)
            c = line.counters
            c.admitted_pkts, c.admitted_bytes = st["admitted_pkts"], st["admitted_bytes"]
            c.forwarded_pkts, c.forwarded_bytes = st["forwarded_pkts"], st["forwarded_bytes"]
            c.dropped_pkts["queue"], c.dropped_bytes["queue"] = (st["queue_pkts"],
                                                                 st["queue_bytes"])
            line.held_pkts, line.held_bytes = st["held_pkts"], st["held_bytes"]
            line._last_release_s = st["last_release_s"]
            self._plain.discard(key)
        limit_pkts, limit_bytes = imp.queue_limits()
        self.core.set_link(si, di, plain, max(0.0, imp.delay_ms) / 1e3, limit_pkts,
                           limit_bytes)
        if plain:
            self._plain.add(key)

    # -- the loop

    def run(self) -> str:
        """Forward until stopped; the reason ('eof', 'SIGTERM', ...)."""
        gc.disable()
        if self.core is not None:
            return self._run_core()
        poll, clock = self._epoll.poll, self.clock
        while self.stop_reason is None:
            self.release_due()
            for fd, _ in poll(self._timeout_s(clock())):
                self._on_ready(fd)
        return self.stop_reason

    def _run_core(self) -> str:
        run, take_released, lines = self.core.run, self.core.take_released, self.lines
        ranks = [p.rank for p in self.spec.ports]
        while self.stop_reason is None:
            ready, frames = run(1.0)
            for si, di, size_bytes, pkts in take_released():
                lines[(ranks[si], ranks[di])].released(size_bytes, pkts)
            for si, _di, frame, arrival_s in frames:
                self.on_frame(ranks[si], frame, arrival_s)
            for fd in ready:
                self._on_ready(fd)
        return self.stop_reason

    def _timeout_s(self, now_s: float) -> float:
        """epoll rounds its timeout up to whole ms: ask for whole ms that end before the next
        release (minus WAKE_EARLY_S); under a ms, sleep the rest here and poll without
        waiting."""
        if not self.heap:
            return 1.0
        wait_s = self.heap[0][0] - now_s
        whole_ms = math.floor((wait_s - WAKE_EARLY_S) * 1e3)
        if whole_ms >= 1:
            return (whole_ms - 0.5) / 1e3        # ceil(x - 0.5 ms) = x ms
        if wait_s > 0:
            time.sleep(wait_s)
        return 0.0

    def _on_ready(self, fd: int) -> None:
        rank = self.rank_of_fd.get(fd)
        if rank is not None:
            self._drain(rank, self.socks[rank])
        elif fd == self.control_fd:
            self._read_control()
        elif fd == self._wake_r:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 512)
        elif fd == self.reply_fd:
            self.flush_replies()

    def _drain(self, rank: int, sock: socket.socket) -> None:
        recv, view, counts, clock = sock.recvmsg_into, self._view, self.counts, self.clock
        bufs = [self._buf]
        for _ in range(BATCH_FRAMES):
            try:
                nbytes, anc, flags, _addr = recv(bufs, ANC_BUF_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._count_errno("recv", exc)
                return
            now_s = clock()
            counts["received"] += 1
            if flags & socket.MSG_TRUNC:
                counts["truncated"] += 1
                continue
            arrival_s, stamped = _arrival_s(anc, now_s)
            if not stamped:
                counts["no_timestamp"] += 1
            self.lag.add(now_s - arrival_s)
            self.on_frame(rank, bytes(view[:nbytes]), arrival_s)
            heap = self.heap
            if heap and heap[0][0] <= now_s:
                self.release_due()       # a due release does not wait for the batch

    # -- one frame

    def on_frame(self, src: int, frame: bytes, arrival_s: float) -> None:
        """Decide one frame from port ``src`` (vnet header included)."""
        counts = self.counts
        if len(frame) < VNET_LEN + ETH_LEN:
            counts["malformed"] += 1
            return
        if frame[VNET_LEN] & 1 or frame[VNET_LEN + 12:VNET_LEN + 14] != ETHERTYPE_IPV4:
            self._flood(src, frame)
            return
        info = parse_ipv4(frame)
        if info is None:
            counts["malformed"] += 1
            return
        dst = self.route.get(info.dst_ip)
        if dst is None:
            counts["unroutable"] += 1
            return
        if dst == src:
            counts["hairpin"] += 1
            return
        if self.core is not None:
            self.line(src, dst)
            if (src, dst) in self._plain:    # a link first seen: the core decides it now
                self.core.frame(self.index_of_rank[src], frame, arrival_s)
                return
        if frame[1] == GSO_NONE:
            line = self.line(src, dst)
            release_s = line.admit(len(frame) - VNET_LEN, arrival_s)
            if release_s is not None:
                self._push(release_s, src, dst, frame, line, len(frame) - VNET_LEN, 1)
            return
        self._on_gso(src, dst, frame, info, arrival_s)

    def _on_gso(self, src: int, dst: int, frame: bytes, info: FrameInfo,
                arrival_s: float) -> None:
        counts = self.counts
        seg = gso_segments(frame, info)
        if seg is None:
            counts["malformed"] += 1
            return
        segments, hdr_end = seg
        counts["gso_frames"] += 1
        line = self.line(src, dst)
        size = len(frame) - VNET_LEN
        splittable = frame[1] & ~GSO_ECN == GSO_TCPV4
        if not splittable:
            counts["gso_unsplit"] += 1
            release_s = line.admit(size, arrival_s)
            if release_s is not None:
                self._push(release_s, src, dst, frame, line, size, 1)
            return
        v = line.admit_gso(size, arrival_s, segments)
        if v.release_s is None:
            return
        payload: bytes | tuple = frame
        if v.lost:
            counts["gso_split"] += 1
            lost = set(v.lost)
            payload = tuple(segment_tcp4(frame, info, hdr_end,
                                         (i for i in range(segments) if i not in lost)))
        self._push(v.release_s, src, dst, payload, line, v.held_bytes, v.held_pkts)

    def _push(self, release_s: float, src: int, dst: int, payload, line: LinkLine,
              held_bytes: int, held_pkts: int) -> None:
        if self.core is not None:
            self.core.push(release_s, self.index_of_rank[src], self.index_of_rank[dst],
                           payload, held_bytes, held_pkts)
            return
        heap = self.heap
        if (not heap or heap[0][0] > release_s) and release_s <= self.clock():
            # already due and nothing due before it (a zero-delay link, a reordered packet):
            # out now rather than after the rest of the batch is read
            self._release(release_s, dst, payload, line, held_bytes, held_pkts)
            return
        self.seq += 1
        heapq.heappush(self.heap, (release_s, self.seq, dst, payload, line, held_bytes,
                                   held_pkts))

    def _flood(self, src: int, frame: bytes) -> None:
        self.counts["flooded"] += 1
        for rank, sock in self.socks.items():
            if rank != src:
                self._send(sock, frame)

    def _send(self, sock: socket.socket, frame: bytes) -> None:
        try:
            sock.send(frame)
            self.counts["forwarded_frames"] += 1
        except OSError as exc:
            self._count_errno("send", exc)

    def _count_errno(self, what: str, exc: OSError) -> None:
        self.counts["send_errors" if what == "send" else "recv_errors"] += 1
        name = f"{what}:{errno.errorcode.get(exc.errno, exc.errno)}"
        self.send_errnos[name] = self.send_errnos.get(name, 0) + 1

    def release_due(self) -> None:
        """Send everything whose release time has come, in release order."""
        heap, clock = self.heap, self.clock
        while heap and heap[0][0] <= clock():
            release_s, _, dst, payload, line, held_bytes, held_pkts = heapq.heappop(heap)
            self._release(release_s, dst, payload, line, held_bytes, held_pkts)

    def _release(self, release_s: float, dst: int, payload, line: LinkLine, held_bytes: int,
                 held_pkts: int) -> None:
        sock = self.socks[dst]
        self.late.add(self.clock() - release_s)
        if isinstance(payload, tuple):
            for seg in payload:
                self._send(sock, seg)
        else:
            self._send(sock, payload)
        line.released(held_bytes, held_pkts)

    # -- control

    def _read_control(self) -> None:
        while True:
            try:
                chunk = os.read(self.control_fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                if self._control_tail.strip():
                    self._control_line(self._control_tail)
                self._control_tail = b""
                self.stop_reason = self.stop_reason or "eof"
                self._unregister(self.control_fd)
                return
            *lines, self._control_tail = (self._control_tail + chunk).split(b"\n")
            if len(self._control_tail) > 1 << 20:
                self._control_tail = b""
                self.counts["control_errors"] += 1
            for raw in lines:
                if raw.strip():
                    self._control_line(raw)
            if not self._control_drains:
                return

    # -- replies

    def _queue_reply(self, answer: dict) -> None:
        """One JSON line to ``reply_fd``. A non-blocking pipe takes at most its free space (64
        KiB by default, pipe(7)) per write: what it does not take is kept and written when the
        loop sees it writable (EPOLLOUT), so a reply of any size arrives whole."""
        data = (json.dumps(answer) + "\n").encode()
        if len(self._out) + len(data) > REPLY_BUF_LIMIT_BYTES:
            self.counts["replies_dropped"] += 1
            return
        self._out += data
        self.flush_replies()

    def flush_replies(self) -> None:
        """Write what the pipe takes now; watch for writability while anything is left."""
        while self._out:
            try:
                n = os.write(self.reply_fd, self._out)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:                  # nobody will read (EPIPE, EBADF): drop them
                self.counts["replies_dropped"] += self._out.count(b"\n")
                self._out.clear()
                break
            del self._out[:n]
        self._watch_out(bool(self._out))

    def _watch_out(self, want: bool) -> None:
        if want == self._out_watched or self._epoll is None:
            return
        if want:
            try:
                self._epoll.register(self.reply_fd, select.EPOLLOUT)
            except PermissionError:          # a regular file: its writes do not stop short
                return
        else:
            self._unregister(self.reply_fd)
        self._out_watched = want

    def _flush_at_close(self) -> None:
        deadline = time.monotonic() + CLOSE_FLUSH_S
        while self._out and time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                select.select([], [self.reply_fd], [], max(0.0, deadline - time.monotonic()))
            self.flush_replies()

    def _unregister(self, fd: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._epoll.unregister(fd)

    def _control_line(self, raw: bytes) -> None:
        try:
            msg = json.loads(raw)
            answer = self.control(msg)
        except (ValueError, TypeError, KeyError) as exc:
            self.counts["control_errors"] += 1
            answer = {"ok": False, "error": str(exc)}
        self.reply(answer)

    def control(self, msg: Any) -> dict:
        """One control message (a parsed JSON object); the reply."""
        if not isinstance(msg, dict):
            raise ValueError(f"a control message is a JSON object, not {msg!r}")
        op = msg.get("op")
        if op == "set":
            return self._set(msg)
        if op == "stats":
            stats = self.stats()
            if self.spec.stats_path:
                write_atomically(self.spec.stats_path, stats)
            return {"ok": True, "op": "stats", "stats": stats}
        if op == "lateness":
            return {"ok": True, "op": "lateness", "lateness": self.lateness()}
        if op == "mark":
            late, lag = self._histograms()
            self._mark = (late.copy(), lag.copy(), self.clock())
            return {"ok": True, "op": "mark"}
        raise ValueError(f"op = {op!r} is unknown; expected 'set', 'stats', 'lateness' or 'mark'")

    def _histograms(self) -> tuple[Histogram, Histogram]:
        """(release lateness, read lag) so far, of whichever engine forwards."""
        if self.core is not None:
            return (Histogram.from_bins(*self.core.histogram("late")),
                    Histogram.from_bins(*self.core.histogram("lag")))
        return self.late, self.lag

    def _set(self, msg: dict) -> dict:
        src, dst = msg.get("src"), msg.get("dst")
        ranks = set(self.socks) or {p.rank for p in self.spec.ports}
        if src not in ranks or dst not in ranks or src == dst:
            raise ValueError(f"link ({src!r}, {dst!r}) is not a pair of distinct port ranks "
                             f"(ports have {sorted(ranks)})")
        changes = {k: v for k, v in msg.items() if k not in ("op", "src", "dst")}
        new = self.impairments.get((src, dst), self.spec.default).updated(changes)
        self.impairments[(src, dst)] = new
        line = self.line(src, dst)
        line.set_impairment(new)
        if self.core is not None:
            self._core_link((src, dst), new, line)
        return {"ok": True, "op": "set", "src": src, "dst": dst, "impairment": new.to_json()}

    # -- stats

    def _kernel_drops(self) -> dict[str, int]:
        """Frames each port's socket lost before we read them (its receive buffer was full):
        PACKET_STATISTICS, which resets on every read, summed here."""
        for rank, sock in self.socks.items():
            with contextlib.suppress(OSError, AttributeError, struct.error):
                raw = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, TPACKET_STATS.size)
                self.kernel_drops[rank] = (self.kernel_drops.get(rank, 0)
                                           + TPACKET_STATS.unpack(raw)[1])
        return {f"p{rank}": n for rank, n in sorted(self.kernel_drops.items())}

    def _link_entry(self, key: tuple[int, int], line: LinkLine) -> dict:
        entry = {"src": key[0], "dst": key[1], "impairment": line.impairment.to_json(),
                 "counters": line.counters.as_dict(), "held_pkts": line.held_pkts,
                 "held_bytes": line.held_bytes}
        if key in self._plain:               # the core's counts: only queue drops there
            st = self.core.link_state(self.index_of_rank[key[0]], self.index_of_rank[key[1]])
            c = entry["counters"]
            for k in ("admitted_pkts", "admitted_bytes", "forwarded_pkts", "forwarded_bytes"):
                c[k] = st[k]
            c["dropped_pkts"]["queue"], c["dropped_bytes"]["queue"] = (st["queue_pkts"],
                                                                       st["queue_bytes"])
            entry["held_pkts"], entry["held_bytes"] = st["held_pkts"], st["held_bytes"]
        return entry

    def lateness(self) -> dict:
        """The release lateness and read lag so far (and since the mark): the part of
        ``stats`` a live verdict reads."""
        late, lag = self._histograms()
        out = {"engine": self.engine, "late_release": late.summary_ms(),
               "read_lag": lag.summary_ms()}
        if self._mark is not None:
            late0, lag0, at_s = self._mark
            out["since_mark"] = {"uptime_s": round(self.clock() - at_s, 3),
                                 "late_release": late.since(late0).summary_ms(),
                                 "read_lag": lag.since(lag0).summary_ms()}
        return out

    def stats(self) -> dict:
        links = [self._link_entry(key, line) for key, line in sorted(self.lines.items())]
        counts, errors = dict(self.counts), dict(self.send_errnos)
        held = len(self.heap)
        if self.core is not None:
            for name, n in self.core.counters().items():
                counts[name] += n
            for is_send, err, n in self.core.errnos():
                name = f"{'send' if is_send else 'recv'}:{errno.errorcode.get(err, err)}"
                errors[name] = errors.get(name, 0) + n
            held = self.core.held()
        lateness = self.lateness()
        since = lateness.get("since_mark")
        return {"version": SPEC_VERSION, "pid": os.getpid(), "engine": self.engine,
                "uptime_s": round(self.clock() - self.started_s, 3),
                "stop_reason": self.stop_reason, "frames": counts,
                "errors": errors, "held_frames": held,
                "budget": {"limit_bytes": self.budget.limit_bytes,
                           "held_bytes": self.budget.held_bytes,
                           "refused": self.budget.refused},
                "late_release": lateness["late_release"],
                "read_lag": lateness["read_lag"],
                "socket_drops": self._kernel_drops(), "links": links,
                **({"since_mark": since} if since is not None else {})}

    def close(self) -> None:
        if self.spec.stats_path:
            write_atomically(self.spec.stats_path, self.stats())
        self._flush_at_close()
        for sock in self.socks.values():
            sock.close()
        if self._epoll is not None:
            self._epoll.close()


def _stdout_nonblocking() -> None:
    """A pipe nobody reads must not stall the loop; a terminal or file is left as it is."""
    try:
        if stat.S_ISFIFO(os.fstat(1).st_mode):
            os.set_blocking(1, False)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    die_with_parent()
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\nusage: python -m netem.packetline SPEC.json",
              file=sys.stderr)
        return 2
    try:
        spec = PacketLineSpec.load(argv[0])
    except (OSError, SpecError) as exc:
        print(f"packetline: {exc}", file=sys.stderr)
        return 2
    _stdout_nonblocking()
    try:
        line = PacketLine(spec)
    except SpecError as exc:
        print(f"packetline: {exc}", file=sys.stderr)
        return 2
    try:
        line.open()
    except OSError as exc:
        print(f"packetline: cannot open the ports: {exc}", file=sys.stderr)
        return 1
    line.install_signals()
    try:
        line.run()
    finally:
        line.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
