"""The packet delay line (``netem.packetline``) in real namespaces, measured with sockets and
clocks of its own: nothing here asks the line how it did before checking what arrived.

Each test runs one "lab" (this file run as a script, ``--lab``) inside ``unshare -Urnm``: a
switch namespace whose ports ``p<k>`` are not bridged, worker namespaces with ``eth0``, the
packet line between them, and the measurements. Worker namespaces and the lab share
CLOCK_REALTIME, so a UDP packet stamped with ``time.time()`` by its sender and with the
kernel's receive stamp (SO_TIMESTAMPNS) at its receiver measures the one-way delay.

Sockets are made inside a namespace by ``setns`` in the lab's main thread (a socket stays in
the namespace it was made in), then used from threads; no extra process per measurement.
``benchmarks/bench_packetline.py`` uses the same lab.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import os
import select
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from netem.impair import Impairment  # noqa: E402
from netem.packetline import SO_TIMESTAMPNS, TIMESPEC, PacketLineSpec, Port  # noqa: E402

CLONE_NEWNET = 0x40000000
TCP_INFO_RTT_AT = 68                      # tcpi_rtt (us), include/uapi/linux/tcp.h
TCP_INFO_TOTAL_RETRANS_AT = 100
UDP_PORT = 40_000
TCP_PORT = 41_000
PROBE = struct.Struct("!Id")              # sequence number, sender's time.time()
LAB_TIMEOUT_S = 90.0


# ================================================================ the lab (inside the userns)

def sh(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")


def address(rank: int) -> str:
    return f"198.18.{(rank + 1) >> 8}.{(rank + 1) & 255}"


class Lab:
    """A switch namespace ``sw`` and ``workers`` namespaces ``w<k>`` whose eth0 reaches the
    switch's port p<k>; the packet line runs in ``sw``. Only inside a user namespace."""

    def __init__(self, workers: int, workdir: str, tcp_buf_bytes: int = 16 << 20,
                 engine: str = "auto"):
        self.workers, self.workdir, self.engine = workers, workdir, engine
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        sh("mount", "-t", "tmpfs", "-o", "size=1m", "lab", "/run")
        os.makedirs("/run/netns", exist_ok=True)
        sh("ip", "link", "set", "lo", "up")
        sh("ip", "netns", "add", "sw")
        sh("ip", "-n", "sw", "link", "set", "lo", "up")
        self._sysctl("sw", "net/ipv6/conf/all/disable_ipv6", "1")
        self._sysctl("sw", "net/ipv6/conf/default/disable_ipv6", "1")
        for k in range(workers):
            self._add_worker(k, tcp_buf_bytes)
        self.line: subprocess.Popen | None = None
        self.spec: PacketLineSpec | None = None

    def _sysctl(self, ns: str, key: str, value: str) -> None:
        with self.inside(ns), open(f"/proc/sys/{key}", "w") as f:
            f.write(value)

    def _add_worker(self, k: int, tcp_buf_bytes: int) -> None:
        ns = f"w{k}"
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{k}",
           "netns", "sw")
        sh("ip", "-n", ns, "addr", "add", f"{address(k)}/15", "dev", "eth0")
        self._sysctl(ns, "net/ipv6/conf/all/disable_ipv6", "1")
        # the window a bandwidth-delay product needs: autotuning up to this
        for key in ("tcp_rmem", "tcp_wmem"):
            self._sysctl(ns, f"net/ipv4/{key}", f"4096 131072 {tcp_buf_bytes}")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", "sw", "link", "set", f"p{k}", "up")

    def shape(self, rank: int, rate_mbit: float, mtu: int = 1500) -> None:
        """HTB on worker ``rank``'s eth0 at ``rate_mbit`` of goodput (the project's rates and
        bursts, netem.commands)."""
        from netem.commands import burst_args, htb_rate_bps
        bps = htb_rate_bps(rate_mbit, mtu)
        ns = f"w{rank}"
        sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb",
           "default", "1")
        sh("tc", "-n", ns, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1",
           "htb", "rate", f"{bps}bit", "ceil", f"{bps}bit", *burst_args(bps, mtu))
        sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "parent", "1:1", "pfifo", "limit",
           "1000")

    @contextlib.contextmanager
    def inside(self, ns: str):
        """This thread in namespace ``ns`` for the block."""
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if self._libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {ns}")
            yield
        finally:
            self._libc.setns(self._home, CLONE_NEWNET)
            os.close(fd)

    def socket(self, rank: int, family=socket.AF_INET, kind=socket.SOCK_DGRAM,
               proto: int = 0) -> socket.socket:
        with self.inside(f"w{rank}"):
            return socket.socket(family, kind, proto)

    # -- the line

    def start_line(self, links: dict, default: Impairment | None = None, seed: int = 1,
                   timeout_s: float = 10.0) -> None:
        ports = tuple(Port(k, f"p{k}", address(k)) for k in range(self.workers))
        self.spec = PacketLineSpec(ports=ports, links=links, default=default or Impairment(),
                                   seed=seed, stats_path=f"{self.workdir}/stats.json",
                                   ready_path=f"{self.workdir}/ready.json",
                                   engine=self.engine)
        path = f"{self.workdir}/spec.json"
        self.spec.save(path)
        self.line = subprocess.Popen(
            ["ip", "netns", "exec", "sw", sys.executable, "-m", "netem.packetline", path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(REPO))
        deadline = time.monotonic() + timeout_s
        while not os.path.exists(self.spec.ready_path):
            if self.line.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the packet line did not start (exit {self.line.poll()})")
            time.sleep(0.02)

    def control(self, msg: dict, timeout_s: float = 5.0) -> dict:
        self.line.stdin.write((json.dumps(msg) + "\n").encode())
        self.line.stdin.flush()
        ready, _, _ = select.select([self.line.stdout], [], [], timeout_s)
        if not ready:
            raise RuntimeError(f"no reply to {msg}")
        return json.loads(self.line.stdout.readline())

    def stop_line(self, how: str = "eof", timeout_s: float = 10.0) -> dict:
        """Stop the line (closing its stdin, or SIGTERM); its exit code and final stats."""
        if how == "eof":
            self.line.stdin.close()
        else:
            self.line.terminate()
        rc = self.line.wait(timeout_s)
        with open(self.spec.stats_path) as f:
            stats = json.load(f)
        self.line = None
        return {"rc": rc, "stats": stats}


def link_stats(stats: dict, src: int, dst: int) -> dict:
    for entry in stats["links"]:
        if entry["src"] == src and entry["dst"] == dst:
            return entry
    return {}


# ---------------------------------------------------------------- measurements

def _receive_udp(sock: socket.socket, count: int, deadline_s: float, out: list) -> None:
    """(seq, sent_s, kernel receive stamp) of each probe until ``count`` or the deadline."""
    while len(out) < count:
        left = deadline_s - time.monotonic()
        if left <= 0:
            return
        sock.settimeout(left)
        try:
            data, anc, _, _ = sock.recvmsg(64, socket.CMSG_SPACE(TIMESPEC.size))
        except TimeoutError:
            return
        stamp = [TIMESPEC.unpack_from(d) for lvl, kind, d in anc if kind == SO_TIMESTAMPNS]
        if len(data) >= PROBE.size and stamp:
            seq, sent_s = PROBE.unpack_from(data)
            out.append((seq, sent_s, stamp[0][0] + stamp[0][1] * 1e-9))


def udp_probe(lab: Lab, src: int, dst: int, count: int, interval_s: float,
              burst: int = 1, port: int = UDP_PORT, max_delay_s: float = 1.0) -> dict:
    """Send ``count`` stamped probes src -> dst, ``burst`` at a time every ``interval_s``;
    what arrived: one-way delays (ms) in arrival order and the sequence numbers."""
    rx = lab.socket(dst)
    rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    rx.bind((address(dst), port))
    tx = lab.socket(src)
    got: list = []
    deadline = time.monotonic() + count / burst * interval_s + max_delay_s + 1.0
    t = threading.Thread(target=_receive_udp, args=(rx, count, deadline, got), daemon=True)
    t.start()
    start = time.monotonic()
    for i in range(count):
        if i % burst == 0:
            wait = start + (i // burst) * interval_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
        tx.sendto(PROBE.pack(i, time.time()), (address(dst), port))
    t.join(max(0.0, deadline - time.monotonic()) + 1.0)
    rx.close()
    tx.close()
    return {"sent": count, "seqs": [g[0] for g in got],
            "delays_ms": [(g[2] - g[1]) * 1e3 for g in got]}


def warm_up(lab: Lab, pairs) -> None:
    """ARP between each pair (the first packet of a pair waits for it)."""
    for src, dst in pairs:
        udp_probe(lab, src, dst, 3, 0.002, port=UDP_PORT - 1, max_delay_s=0.2)


def tcp_pair(lab: Lab, src: int, dst: int, port: int) -> tuple[socket.socket, socket.socket]:
    """A connected TCP pair: (socket in src, accepted socket in dst)."""
    ls = lab.socket(dst, kind=socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((address(dst), port))
    ls.listen(8)
    c = lab.socket(src, kind=socket.SOCK_STREAM)
    c.settimeout(10)
    c.connect((address(dst), port))
    ls.settimeout(10)
    s, _ = ls.accept()
    ls.close()
    return c, s


def tcp_info_u32(sock: socket.socket, offset: int) -> int:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    return struct.unpack_from("=I", raw, offset)[0]


def tcp_ping_pong(lab: Lab, src: int, dst: int, rounds: int, port: int = TCP_PORT) -> dict:
    """Round trips of one byte over TCP (from the client's send to the kernel's receive stamp
    of the echo) and the kernel's smoothed RTT (tcpi_rtt)."""
    c, s = tcp_pair(lab, src, dst, port)
    for sock in (c, s):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(10)

    def echo():
        for _ in range(rounds):
            data = s.recv(1)
            if not data:
                return
            s.sendall(data)
    t = threading.Thread(target=echo, daemon=True)
    t.start()
    c.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    rtts = []
    for _ in range(rounds):
        t0 = time.time()
        c.sendall(b"x")
        _, anc, _, _ = c.recvmsg(1, socket.CMSG_SPACE(TIMESPEC.size))
        # the reply's arrival as the kernel stamped it: the client's wake-up is not counted
        stamp = [TIMESPEC.unpack_from(d) for lvl, kind, d in anc if kind == SO_TIMESTAMPNS]
        t1 = stamp[0][0] + stamp[0][1] * 1e-9 if stamp else time.time()
        rtts.append((t1 - t0) * 1e3)
    t.join(5)
    srtt_ms = tcp_info_u32(c, TCP_INFO_RTT_AT) / 1e3
    c.close()
    s.close()
    return {"rtts_ms": rtts, "tcpi_rtt_ms": srtt_ms}


def _pattern(n: int) -> bytes:
    return hashlib.sha256(n.to_bytes(8, "big")).digest() * (1 << 15)    # 1 MiB, non-constant


def bulk_tcp(lab: Lab, pairs, seconds: float, warm_s: float, port: int = TCP_PORT + 10) -> dict:
    """One bulk TCP flow per (src, dst) pair for ``seconds``; each receiver's goodput over the
    window after ``warm_s`` (timed by the receiver), whether its bytes are what was sent, and
    the sender's retransmissions."""
    conns = [tcp_pair(lab, s, d, port + i) for i, (s, d) in enumerate(pairs)]
    stop_at = time.monotonic() + seconds
    results = [dict() for _ in conns]

    def send(i, sock):
        digest, sent, n = hashlib.sha256(), 0, 0
        while time.monotonic() < stop_at:
            chunk = _pattern(n)
            sock.sendall(chunk)
            digest.update(chunk)
            sent += len(chunk)
            n += 1
        results[i]["retrans"] = tcp_info_u32(sock, TCP_INFO_TOTAL_RETRANS_AT)
        sock.shutdown(socket.SHUT_WR)
        results[i].update(sent_bytes=sent, sent_sha=digest.hexdigest())

    def recv(i, sock):
        digest, total, t0 = hashlib.sha256(), 0, time.monotonic()
        window_bytes, window_start, window_end = 0, t0 + warm_s, None
        buf = bytearray(1 << 20)
        sock.settimeout(seconds + 10)
        while True:
            n = sock.recv_into(buf)
            if not n:
                break
            now = time.monotonic()
            digest.update(memoryview(buf)[:n])
            total += n
            if window_start <= now <= stop_at:
                window_bytes += n
                window_end = now
        span = (window_end or window_start) - window_start
        results[i].update(recv_bytes=total, recv_sha=digest.hexdigest(),
                          goodput_mbit=window_bytes * 8 / span / 1e6 if span > 0 else 0.0)
    threads = []
    for i, (c, s) in enumerate(conns):
        threads += [threading.Thread(target=send, args=(i, c), daemon=True),
                    threading.Thread(target=recv, args=(i, s), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 20)
    for c, s in conns:
        c.close()
        s.close()
    return {"flows": results}


def snmp(lab: Lab, rank: int) -> dict:
    """Worker ``rank``'s /proc/net/snmp counters, as {'Tcp': {...}, 'Ip': {...}, ...}."""
    with lab.inside(f"w{rank}"), open("/proc/thread-self/net/snmp") as f:
        lines = f.read().splitlines()
    out = {}
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        proto = names.split(":")[0]
        out[proto] = dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=True))
    return out


def inject_garbage(lab: Lab, src: int) -> int:
    """Frames no correct stack sends, from worker ``src``'s eth0: a bare Ethernet header, a
    non-IPv4 version, a header length below 20, an IPv4 header cut short, an unknown
    destination. The number of frames sent."""
    raw = lab.socket(src, socket.AF_PACKET, socket.SOCK_RAW, 0)
    raw.bind(("eth0", 0))
    eth = bytes.fromhex("020000000001" "020000000002" "0800")
    good_ip = bytes.fromhex("450000280000400040060000") + socket.inet_aton(address(src))
    frames = [eth,
              eth + b"\x65" + good_ip[1:] + socket.inet_aton(address(1)),
              eth + b"\x43" + good_ip[1:] + socket.inet_aton(address(1)),
              eth + good_ip[:10],
              eth + good_ip + socket.inet_aton("198.18.9.9") + bytes(20)]
    for f in frames:
        raw.send(f)
    raw.close()
    return len(frames)


# ---------------------------------------------------------------- scenarios

def _basic(lab: Lab) -> dict:
    """Delay, RTT, jitter, order, loss, garbage, live change and stats, one after another."""
    lab.start_line({
        (0, 1): Impairment(delay_ms=20.0), (1, 0): Impairment(delay_ms=20.0),
        (0, 2): Impairment(delay_ms=20.0, jitter_ms=4.0, jitter_dist="normal", reorder=True),
        (2, 1): Impairment(delay_ms=10.0, jitter_ms=4.0, jitter_dist="normal"),
        (2, 0): Impairment(loss_pct=1.0),
    }, seed=7)
    warm_up(lab, [(0, 1), (1, 0), (0, 2), (2, 0), (2, 1)])
    out = {"udp_delay": udp_probe(lab, 0, 1, 300, 0.003),
           "tcp_rtt": tcp_ping_pong(lab, 0, 1, 30),
           "jitter": udp_probe(lab, 0, 2, 800, 0.0015),
           "fifo": udp_probe(lab, 2, 1, 2000, 0.001, burst=2)}
    before = lab.control({"op": "stats"})["stats"]
    out["loss"] = udp_probe(lab, 2, 0, 20_000, 0.001, burst=20)
    out["loss_line_before"] = link_stats(before, 2, 0)
    out["garbage_sent"] = inject_garbage(lab, 0)
    out["set_reply"] = lab.control({"op": "set", "src": 0, "dst": 1, "delay_ms": 5.0})
    out["udp_delay_after_set"] = udp_probe(lab, 0, 1, 100, 0.003)
    out["bad_control"] = lab.control({"op": "set", "src": 0, "dst": 1, "delay_ms": -1})
    out["stats_reply_ok"] = lab.control({"op": "stats"})["ok"]
    out["stop"] = lab.stop_line("eof")
    return out


def _bulk(lab: Lab, args: dict) -> dict:
    """Goodput of a shaped flow over a long delay, then an unshaped flow with loss (GSO
    frames cut in userspace): its bytes, checksum errors at the receiver, retransmissions."""
    rate = args.get("rate_mbit", 200.0)
    lab.shape(1, rate)
    lab.shape(0, rate)           # within what the line carries: its lateness stays small
    delay = args.get("delay_ms", 50.0)
    lab.start_line({(1, 2): Impairment(delay_ms=delay), (2, 1): Impairment(delay_ms=delay),
                    (0, 2): Impairment(delay_ms=5.0, loss_pct=1.0),
                    (2, 0): Impairment(delay_ms=5.0)}, seed=3)
    warm_up(lab, [(1, 2), (2, 1), (0, 2), (2, 0)])
    out = {"rate_mbit": rate, "delay_ms": delay}
    out["shaped"] = bulk_tcp(lab, [(1, 2)], args.get("seconds", 3.0), args.get("warm_s", 1.2))
    snmp_before = snmp(lab, 2)
    out["lossy"] = bulk_tcp(lab, [(0, 2)], 1.5, 0.5, port=TCP_PORT + 20)
    out["snmp_before"], out["snmp_after"] = snmp_before, snmp(lab, 2)
    out["stop"] = lab.stop_line("term")
    return out


def lab_main(args: dict) -> dict:
    lab = Lab(args.get("workers", 3), args["workdir"], engine=args.get("engine", "auto"))
    if args["scenario"] == "basic":
        return _basic(lab)
    if args["scenario"] == "bulk":
        return _bulk(lab, args)
    raise ValueError(f"unknown scenario {args['scenario']!r}")


def run_lab(args: dict, timeout_s: float = LAB_TIMEOUT_S) -> dict:
    """Run a lab scenario in its own user, network and mount namespace; its result."""
    proc = subprocess.run(["unshare", "-Urnm", "--", sys.executable, str(HERE), "--lab",
                           json.dumps(args)], capture_output=True, text=True,
                          timeout=timeout_s, cwd=str(REPO))
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"lab failed ({proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


if __name__ == "__main__" and sys.argv[1:2] == ["--lab"]:
    print("RESULT " + json.dumps(lab_main(json.loads(sys.argv[2]))), flush=True)
    sys.exit(0)


# ================================================================ the tests

import pytest  # noqa: E402


def p95(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]


def abs_err(values: list[float], target: float) -> list[float]:
    return [abs(v - target) for v in values]


def _lab_or_skip(tc_caps, args: dict, tmp_path_factory) -> dict:
    from netem.packetline import engine_available
    if args["engine"] == "c" and not engine_available():
        pytest.skip("netem._linecore is not built (no compiler at install)")
    args = dict(args, workdir=str(tmp_path_factory.mktemp("packetline")))
    out = run_lab(args)
    assert out["stop"]["stats"]["engine"] == args["engine"], out["stop"]["stats"]["engine"]
    return out


# every scenario runs with the compiled core and with the pure-Python loop
ENGINES = ["c", "python"]


@pytest.fixture(scope="module", params=ENGINES)
def basic(tc_caps, tmp_path_factory, request):
    return _lab_or_skip(tc_caps, {"scenario": "basic", "engine": request.param},
                        tmp_path_factory)


@pytest.fixture(scope="module", params=ENGINES)
def bulk(tc_caps, tmp_path_factory, request):
    return _lab_or_skip(tc_caps, {"scenario": "bulk", "rate_mbit": 200.0, "delay_ms": 50.0,
                                  "engine": request.param}, tmp_path_factory)


def test_udp_one_way_delay_is_the_configured_delay_within_1ms_at_p95(basic, preempted_ms):
    """Sender and receiver are Python threads beside the line on 2 cores: on CI a few of 300
    probes (1-2 %) read 1-4 ms late, from a wake-up of either; the line's delay under load is
    benchmarks/bench_packetline.py's table (release lateness from the line's own histogram)."""
    r = basic["udp_delay"]
    assert len(r["delays_ms"]) == r["sent"]
    errors = abs_err(r["delays_ms"], 20.0)
    assert statistics.median(errors) <= 0.3, sorted(r["delays_ms"])[-5:]
    assert p95(errors) <= 1.0 + preempted_ms, (sorted(r["delays_ms"])[-5:], preempted_ms)
    assert min(r["delays_ms"]) >= 20.0 - 0.05           # never early


def test_tcp_round_trip_is_twice_the_delay_within_1ms(basic):
    r = basic["tcp_rtt"]
    assert abs(r["tcpi_rtt_ms"] - 40.0) <= 1.0, r["tcpi_rtt_ms"]     # the kernel's own view
    errors = abs_err(r["rtts_ms"], 40.0)
    assert statistics.median(errors) <= 1.0, r["rtts_ms"]
    # the echo is a Python thread on a 2-core machine: allow a rare wake-up outlier
    assert sum(e <= 1.0 for e in errors) >= 0.9 * len(errors), r["rtts_ms"]
    assert min(r["rtts_ms"]) >= 40.0 - 0.05


def test_jitter_spread_and_mean_are_as_configured(basic):
    r = basic["jitter"]
    expected_sd = Impairment(delay_ms=20.0, jitter_ms=4.0, reorder=True).jitter_sd_ms()
    d = r["delays_ms"]
    assert len(d) == r["sent"]
    assert abs(statistics.fmean(d) - 20.0) <= 0.6, statistics.fmean(d)
    assert abs(statistics.stdev(d) - expected_sd) <= 0.1 * expected_sd, statistics.stdev(d)


def test_without_reordering_jittered_packets_keep_their_order(basic):
    r = basic["fifo"]
    assert len(r["seqs"]) == r["sent"]
    assert r["seqs"] == sorted(r["seqs"])
    assert statistics.fmean(r["delays_ms"]) > 10.0     # jitter acted, order kept


def test_one_percent_loss_is_measured_within_20_percent_over_20000_packets(basic):
    r = basic["loss"]
    received = len(set(r["seqs"]))
    lost_share = 1 - received / r["sent"]
    assert 0.008 <= lost_share <= 0.012, lost_share
    # and every lost probe was the line's random loss, nothing else
    after = link_stats(basic["stop"]["stats"], 2, 0)["counters"]["dropped_pkts"]
    before = basic["loss_line_before"]["counters"]["dropped_pkts"]
    assert after["loss"] - before["loss"] == r["sent"] - received
    assert after["queue"] == before["queue"] == 0


def test_garbage_frames_are_counted_and_the_line_keeps_forwarding(basic):
    frames = basic["stop"]["stats"]["frames"]
    assert frames["malformed"] >= 3 and frames["unroutable"] >= 1, frames
    assert len(basic["udp_delay_after_set"]["delays_ms"]) == 100


def test_a_live_change_applies_to_the_next_packets(basic, preempted_ms):
    assert basic["set_reply"]["ok"] and basic["set_reply"]["impairment"]["delay_ms"] == 5.0
    d = basic["udp_delay_after_set"]["delays_ms"]
    assert p95(abs_err(d, 5.0)) <= 1.0 + preempted_ms, sorted(d)[-5:]  # as the one-way test
    assert not basic["bad_control"]["ok"] and "delay_ms" in basic["bad_control"]["error"]


def test_eof_on_stdin_writes_stats_and_exits_0(basic, preempted_ms):
    stop = basic["stop"]
    assert stop["rc"] == 0 and stop["stats"]["stop_reason"] == "eof"
    assert basic["stats_reply_ok"]
    late = stop["stats"]["late_release"]
    # the loss phase offers 20,000 packets a second: the line keeps up, a little behind
    assert late["count"] > 20_000 and late["p50_ms"] < 0.5, late
    assert late["p99_ms"] < 3.0 + preempted_ms, (late, preempted_ms)


def test_shaped_bulk_goodput_is_not_reduced_by_a_50ms_delay(bulk):
    flow = bulk["shaped"]["flows"][0]
    assert flow["recv_sha"] == flow["sent_sha"]
    assert abs(flow["goodput_mbit"] / bulk["rate_mbit"] - 1) <= 0.05, flow


def test_loss_on_gso_frames_is_per_segment_and_cut_frames_have_good_checksums(bulk,
                                                                             preempted_ms):
    flow = bulk["lossy"]["flows"][0]
    assert flow["recv_sha"] == flow["sent_sha"] and flow["recv_bytes"] > 10 << 20, flow
    stats = bulk["stop"]["stats"]
    assert bulk["stop"]["rc"] == 0 and stats["stop_reason"] == "SIGTERM"
    assert stats["frames"]["gso_split"] > 0, stats["frames"]
    assert not any(stats["socket_drops"].values()), stats["socket_drops"]
    c = link_stats(stats, 0, 2)["counters"]
    share = c["dropped_pkts"]["loss"] / c["admitted_pkts"]
    assert 0.007 <= share <= 0.013, c
    before, after = bulk["snmp_before"], bulk["snmp_after"]
    for proto, key in (("Tcp", "InCsumErrors"), ("Ip", "InHdrErrors")):
        assert after[proto][key] == before[proto][key], (proto, key)
    # every lost segment had to be sent again
    assert flow["retrans"] >= 0.5 * c["dropped_pkts"]["loss"], (flow, c)
    assert stats["late_release"]["p99_ms"] < 3.0 + preempted_ms, \
        (stats["late_release"], preempted_ms)
