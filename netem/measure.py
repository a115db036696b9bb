"""The sockets of ``netem measure``: one directed pair of hosts, measured over one TCP
connection that is bound to the run and to the pair.

- ``Listener``: the receiver's socket. It takes connections only from the participating hosts'
  addresses (anything else is closed unread) and acts only on one that passes the handshake
  for the pair it waits for.
- The handshake (``_client_handshake`` / ``_server_handshake``) proves to each end that the
  other holds the run's key (``derive_key``: HMAC-SHA256 of the run's secret and a token fresh
  for this measurement) and binds the connection to one pair: both sides MAC their two fresh
  nonces and the pair (index, src, dst), under different labels so one side's answer cannot
  be played back to it.
- ``send_pair`` (the sender): pings (a 9-byte request echoed by the receiver, TCP_NODELAY),
  then one bounded transfer (``MeasureBounds``: it stops at the bytes or at the pair's bulk
  deadline, whichever comes first), then the receiver's report; the sender's TCP_INFO last.
- ``serve_pair`` (the receiver): echoes, reads the transfer timing each read on its own clock
  (``measureplan.goodput``), within its own bounds whatever the header asks, and reports.

Every socket call has a deadline; sockets are closed in ``finally`` (the sender's with
SO_LINGER 0, so nothing it had queued goes on after it). Nothing here starts a process.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Collection

from netem import tcpinfo
from netem.measureplan import MeasureError, PairBudget, PairResult, goodput, ping_stats

MAGIC = b"GLMEAS1\0"
NONCE_BYTES = 32
MAC_BYTES = 32
PAIR = struct.Struct("!IHH")          # pair index, src node, dst node
PING = struct.Struct("!cQ")           # b"P", sequence number
BULK = struct.Struct("!cQd")          # b"B", bytes, seconds
LENGTH = struct.Struct("!I")
MAX_REPORT_BYTES = 64 * 1024
CHUNK_BYTES = 256 * 1024
HANDSHAKE_S = 5.0                     # at most, for one connection's handshake
POINT_EVERY_S = 0.001                 # the receiver's clock is sampled at most this often
SO_TIMESTAMPNS = 35                   # include/uapi/asm-generic/socket.h (SO_TIMESTAMPNS_OLD)
TIMESPEC = struct.Struct("=qq")
ANC_BYTES = socket.CMSG_SPACE(TIMESPEC.size)
Clock = Callable[[], float]


class MeasureRunError(RuntimeError):
    """A pair could not be measured: a peer went away, did not answer in time, or failed the
    handshake; the message says which and why."""


class AddressRefused(MeasureError):
    """An address that is not one of the participating hosts (or not on the allowlist)."""


def derive_key(secret: bytes, token: bytes) -> bytes:
    """The data connections' key: the run's secret (``cluster.load_secret``) bound to this
    measurement's token, so that a key of another run or measurement opens nothing here."""
    return hmac.new(secret, b"gasloc-emu measure\0" + token, hashlib.sha256).digest()


def _mac(key: bytes, label: bytes, nonce_c: bytes, nonce_s: bytes, pair: bytes) -> bytes:
    return hmac.new(key, label + nonce_c + nonce_s + pair, hashlib.sha256).digest()


def _timeout(deadline_s: float, clock: Clock) -> float:
    left = deadline_s - clock()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def _recv_exact(sock: socket.socket, n: int, deadline_s: float, clock: Clock) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        sock.settimeout(_timeout(deadline_s, clock))
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        buf += chunk
    return bytes(buf)


def _send_all(sock: socket.socket, data: bytes, deadline_s: float, clock: Clock) -> None:
    sock.settimeout(_timeout(deadline_s, clock))
    sock.sendall(data)


def _client_handshake(sock, key: bytes, pair: bytes, deadline_s: float, clock: Clock) -> None:
    nonce_c = os.urandom(NONCE_BYTES)
    _send_all(sock, MAGIC + nonce_c + pair, deadline_s, clock)
    reply = _recv_exact(sock, NONCE_BYTES + MAC_BYTES, deadline_s, clock)
    nonce_s, mac_s = reply[:NONCE_BYTES], reply[NONCE_BYTES:]
    if not hmac.compare_digest(mac_s, _mac(key, b"S", nonce_c, nonce_s, pair)):
        raise MeasureRunError("the receiver failed the handshake (another run's key?)")
    _send_all(sock, _mac(key, b"C", nonce_c, nonce_s, pair), deadline_s, clock)


def _server_handshake(sock, key: bytes, pair: bytes, deadline_s: float, clock: Clock) -> None:
    hello = _recv_exact(sock, len(MAGIC) + NONCE_BYTES + PAIR.size, deadline_s, clock)
    if hello[:len(MAGIC)] != MAGIC or hello[len(MAGIC) + NONCE_BYTES:] != pair:
        raise MeasureRunError("not a hello for this pair")
    nonce_c, nonce_s = hello[len(MAGIC):len(MAGIC) + NONCE_BYTES], os.urandom(NONCE_BYTES)
    _send_all(sock, nonce_s + _mac(key, b"S", nonce_c, nonce_s, pair), deadline_s, clock)
    mac_c = _recv_exact(sock, MAC_BYTES, deadline_s, clock)
    if not hmac.compare_digest(mac_c, _mac(key, b"C", nonce_c, nonce_s, pair)):
        raise MeasureRunError("the sender failed the handshake")


def check_address(addr: str, allowed: Collection[str]) -> str:
    if addr not in allowed:
        raise AddressRefused(f"address {addr!r} is not one of the participating hosts "
                             f"({', '.join(sorted(allowed))}); refusing to talk to it")
    return addr


class Listener:
    """The receiving end of this host's pairs; ``allowed``: the participating hosts' addresses
    (set once they are known; until then nothing is accepted)."""

    def __init__(self, addr: str, key: bytes, clock: Clock = time.monotonic):
        self.key, self.clock = key, clock
        self.allowed: frozenset[str] = frozenset()
        self.refused: list[str] = []      # why each connection that was not acted on was closed
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.bind((addr, 0))
            self.sock.listen(8)
        except OSError:
            self.sock.close()
            raise
        self.port = self.sock.getsockname()[1]

    def accept_pair(self, index: int, src: int, dst: int, deadline_s: float) -> socket.socket:
        """The connection of pair ``index`` (src -> this host), authenticated, by
        ``deadline_s``; connections from elsewhere or that fail the handshake are closed."""
        pair = PAIR.pack(index, src, dst)
        while True:
            left = deadline_s - self.clock()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                raise MeasureRunError(f"pair {src}->{dst}: no authenticated connection from "
                                      f"node {src} in time")
            self.sock.settimeout(left)
            try:
                conn, peer = self.sock.accept()
            except TimeoutError:   # the connection went between select and accept
                continue
            if peer[0] not in self.allowed:
                conn.close()
                self.refused.append(f"{peer[0]}: not a participating host")
                continue
            try:
                _server_handshake(conn, self.key, pair, min(deadline_s, self.clock()
                                                            + HANDSHAKE_S), self.clock)
                return conn
            except (OSError, MeasureRunError) as exc:
                conn.close()
                self.refused.append(f"{peer[0]}: {exc}")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect_pair(addr: str, port: int, *, source: str, allowed: Collection[str], key: bytes,
                 index: int, src: int, dst: int, deadline_s: float,
                 clock: Clock = time.monotonic) -> socket.socket:
    """An authenticated connection from this host (``source``) to a participating host."""
    check_address(addr, allowed)
    try:
        sock = socket.create_connection((addr, port), timeout=_timeout(deadline_s, clock),
                                        source_address=(source, 0))
    except (OSError, TimeoutError) as exc:
        raise MeasureRunError(f"pair {src}->{dst}: cannot connect to {addr}:{port}: "
                              f"{exc}") from None
    try:
        _client_handshake(sock, key, PAIR.pack(index, src, dst),
                          min(deadline_s, clock() + HANDSHAKE_S), clock)
    except BaseException as exc:
        sock.close()
        if isinstance(exc, (OSError, TimeoutError)):
            raise MeasureRunError(f"pair {src}->{dst}: handshake with {addr} failed: "
                                  f"{exc}") from None
        raise
    return sock


# ---------------------------------------------------------------- the sender

def _pings(sock, budget: PairBudget, clock: Clock) -> list[float]:
    rtts = []
    for seq in range(budget.bounds.pings):
        if clock() >= budget.ping_deadline_s:
            break
        t0 = time.perf_counter()
        _send_all(sock, PING.pack(b"P", seq), budget.ping_deadline_s, clock)
        echo = _recv_exact(sock, PING.size, budget.deadline_s, clock)
        rtts.append(time.perf_counter() - t0)
        if echo != PING.pack(b"P", seq):
            raise MeasureRunError("the receiver echoed something else than the ping")
    if not rtts:
        raise MeasureRunError("no ping came back before the ping deadline")
    return rtts


def _read_report(sock, budget: PairBudget, clock: Clock) -> dict | None:
    """The receiver's next report; None for its go-ahead (an empty one)."""
    size = LENGTH.unpack(_recv_exact(sock, LENGTH.size, budget.deadline_s, clock))[0]
    if size == 0:
        return None
    if size > MAX_REPORT_BYTES:
        raise MeasureRunError(f"the receiver's report is {size} bytes (at most "
                              f"{MAX_REPORT_BYTES})")
    try:
        report = json.loads(_recv_exact(sock, size, budget.deadline_s, clock))
    except ValueError:
        raise MeasureRunError("the receiver's report is not JSON") from None
    if not isinstance(report, dict):
        raise MeasureRunError("the receiver's report is not a table")
    return report


def _bulk(sock, budget: PairBudget, clock: Clock) -> tuple[int, dict | None, dict | None]:
    """Write at most max_bytes_per_pair, and nothing after the bulk deadline, once the
    receiver said go; bytes written, the receiver's refusal if it did not, and how the
    sender's kernel divides the writing time (``tcpinfo.shares``: sending, held back by the
    receiver's window or the send buffer, idle)."""
    nbytes = budget.bounds.max_bytes_per_pair
    _send_all(sock, BULK.pack(b"B", nbytes, budget.bulk_seconds(clock())), budget.deadline_s,
              clock)
    refusal = _read_report(sock, budget, clock)
    if refusal is not None:
        return 0, refusal, None
    chunk, sent, first = memoryview(bytes(CHUNK_BYTES)), 0, tcpinfo.read(sock)
    while sent < nbytes:
        left = budget.bulk_deadline_s - clock()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            sent += sock.send(chunk[:min(CHUNK_BYTES, nbytes - sent)])
        except TimeoutError:
            break
    held = tcpinfo.shares(first, tcpinfo.read(sock))
    sock.shutdown(socket.SHUT_WR)
    return sent, None, held


def send_pair(sock: socket.socket, budget: PairBudget, src: int, dst: int,
              clock: Clock = time.monotonic) -> PairResult:
    """Measure src -> dst over ``sock`` (authenticated) within ``budget``; the result (with an
    error, not an exception, when the receiver failed)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = _pings(sock, budget, clock)
    sent, report, held = _bulk(sock, budget, clock)
    if report is None:
        report = _read_report(sock, budget, clock) or {}
    sender = (tcpinfo.path(sock) or {}) | {"bytes_written": sent, "while_writing": held}
    seconds = round(clock() - budget.start_s, 4)
    if report.get("error") or not isinstance(report.get("goodput"), dict):
        return PairResult(src, dst, error=f"receiver: {report.get('error') or 'no goodput'}",
                          sender=sender, seconds=seconds)
    got = report["goodput"].get("bytes")
    return PairResult(src, dst, ended_by=budget.ended_by(got if isinstance(got, int) else 0),
                      rtt=ping_stats(rtts), receiver=report["goodput"], sender=sender,
                      seconds=seconds)


def abort_close(sock: socket.socket) -> None:
    """Close with a reset: what the socket still holds is dropped, not sent on."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# ---------------------------------------------------------------- the receiver

def _stamp_s(ancdata: list) -> float | None:
    """The kernel's receive time of the last segment a read consumed (SCM_TIMESTAMPNS,
    CLOCK_REALTIME; net/ipv4/tcp.c tcp_recv_timestamp), or None where it gave none."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            return sec + nsec * 1e-9
    return None


def _receive(sock, nbytes: int, deadline_s: float,
             clock: Clock) -> tuple[list[tuple[float, int]], str]:
    """Read until EOF, ``nbytes`` or ``deadline_s``; (time, bytes so far) after each read, at
    most one point per POINT_EVERY_S but always the last, and which clock timed them: the
    kernel's receive stamps where every read had one (a receiver process that the machine
    runs late does not lower the rate then), else this process's clock."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)   # the caller's, before "go"
    buf = memoryview(bytearray(CHUNK_BYTES))
    by_clock: list[tuple[float, int]] = []
    by_stamp: list[tuple[float | None, int]] = []
    got = 0
    while got < nbytes:
        left = deadline_s - clock()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            n, anc, _, _ = sock.recvmsg_into([buf[:min(CHUNK_BYTES, nbytes - got)]], ANC_BYTES)
        except TimeoutError:
            break
        if n == 0:
            break
        got += n
        now, stamp = clock(), _stamp_s(anc)
        if len(by_clock) < 2 or now - by_clock[-2][0] >= POINT_EVERY_S:
            by_clock.append((now, got))
            by_stamp.append((stamp, got))
        else:   # within a millisecond of the point before: the last point moves on
            by_clock[-1], by_stamp[-1] = (now, got), (stamp, got)
    if by_stamp and all(t is not None for t, _ in by_stamp):
        return by_stamp, "kernel receive timestamps (SO_TIMESTAMPNS)"
    return by_clock, "the receiving process's clock"


def serve_pair(sock: socket.socket, budget: PairBudget, clock: Clock = time.monotonic) -> dict:
    """Answer the sender's pings, time its transfer within this host's own bounds, report."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        head = _recv_exact(sock, 1, budget.deadline_s, clock)
        if head == b"P":
            rest = _recv_exact(sock, PING.size - 1, budget.deadline_s, clock)
            _send_all(sock, head + rest, budget.deadline_s, clock)
            continue
        if head != b"B":
            raise MeasureRunError(f"unexpected message {head!r} from the sender")
        _, nbytes, seconds = BULK.unpack(head + _recv_exact(sock, BULK.size - 1,
                                                           budget.deadline_s, clock))
        break
    limit = budget.bounds.max_bytes_per_pair
    if nbytes > limit or not 0 <= seconds <= budget.bulk_seconds(clock()) + 1.0:
        return _report(sock, budget, clock, {
            "error": f"the sender asked for {nbytes} bytes in {seconds:g} s; this host allows "
                     f"{limit} bytes in {budget.bulk_seconds(clock()):g} s"})
    # stamped from the first segment: set after "go", the sender's first segments could land
    # unstamped and the whole transfer would fall back to this process's clock
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    _send_all(sock, LENGTH.pack(0), budget.deadline_s, clock)      # go
    points, timed_by = _receive(sock, nbytes, budget.bulk_deadline_s, clock)
    try:
        return _report(sock, budget, clock, {"goodput": goodput(points) | {"clock": timed_by}})
    except MeasureError as exc:
        return _report(sock, budget, clock, {"error": str(exc)})


def _report(sock, budget: PairBudget, clock: Clock, report: dict) -> dict:
    data = json.dumps(report).encode()
    _send_all(sock, LENGTH.pack(len(data)) + data, budget.deadline_s, clock)
    return report
