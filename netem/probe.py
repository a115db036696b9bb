"""Measure every link the way the algorithm sees it: configured vs measured goodput and latency.

``probe_links(session, pairs)`` starts one probe agent per worker involved, inside that worker's
namespace (``session.wrap``), i.e. behind the same shaping the workers get. Each agent listens on
its worker's address, sends to its targets, and receives from its sources through the same
userspace release queue the transport uses, so latency added by the release queue is measured
too. A job has two phases, timed by one absolute start time shared by all agents:

1. latency: ``pings`` small messages per link, ``PING_GAP_S`` apart, on idle links; the one-way
   latency of a message is its release time at the receiver minus its send time (one host,
   one clock);
2. goodput: every link sends ``MSG_S`` of data per message for ``seconds_per_link``; goodput is
   the slope of the bytes released over time inside [start + warm-up, end].

Everything is bounded: in time (phases end at fixed times; agents that do not answer in time are
killed), in bytes (twice the configured rate over the phase + 16 MiB), and in where it goes (the
run's own addresses: 198.18.0.0/15 inside namespaces, or 127.0.0.1).

Rows are JSON-able (for links.json). ``ok`` is False when goodput misses the configured rate by
more than 10 % or latency is off by more than max(10 %, 1 ms). With ``parallel=True`` all links
run at once (a busy network: links that share a worker's cap share it, so they read below their
single-flow rate); ``parallel=False`` measures one link at a time.
"""
from __future__ import annotations

import itertools
import json
import math
import queue
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

from netem import tcpinfo
from netem.hoststat import cpu_shares, cpu_times
from netem.userspace import ReleaseQueue, shaping_from_spec

# kind, src, job, send time, deliver_at (NaN: none), payload bytes
HDR = struct.Struct("!BHIddI")
PING, BULK = 0, 1
PING_BYTES = 64
PING_GAP_S = 0.02
MSG_S = 0.02                        # one bulk message carries 20 ms of data at the link's rate
MSG_BYTES_RANGE = (1024, 256 * 1024)
UNSHAPED_RATE_MBIT = 10_000.0       # the byte bound of unshaped links (above what loopback does)
# A sender runs ahead of its link by its socket buffer (at most 2 x 4 MiB, see SNDBUF_RANGE)
# plus the leaf queue; the byte bound must leave room for that or a slow link's phase ends early.
BUDGET_SLACK_B = 16 << 20
START_MARGIN_S = 0.5                # agents connect before the shared start time
SNDBUF_S = 0.25                     # sender socket buffer: this much of the link's rate ...
SNDBUF_RANGE = (256 * 1024, 4 << 20)  # ... within these bounds (the kernel doubles it)
MIN_FIT_POINTS = 8                  # fewer messages in the window: count bytes instead of fitting
TOLERANCE = 0.10
# the latency test's bound; a busy 2-core machine adds ~1 ms of scheduling
LATENCY_TOLERANCE_MS = 2.0


class ProbeError(RuntimeError):
    """An agent failed or did not answer in time; the message names the link or worker."""


# ---------------------------------------------------------------- job timing (pure)

def warmup_s(seconds: float, time_scale: float = 1.0) -> float:
    """Skip TCP's start: a quarter of the phase, at most 0.5 s of emulated time. TCP's start
    lasts round trips, and under time dilation (``time_scale`` K) every round trip is K times
    longer: at K = 4 an undilated 0.5 s skipped little more than one round trip of a 50 ms
    link, and the window read slow start as a 72 % link."""
    return min(0.5 * time_scale, seconds / 4)


def msg_bytes(rate_mbit: float | None) -> int:
    lo, hi = MSG_BYTES_RANGE
    if rate_mbit is None:
        return hi
    return int(min(hi, max(lo, rate_mbit * 1e6 / 8 * MSG_S)))


def sndbuf_bytes(rate_mbit: float | None, time_scale: float = 1.0) -> int:
    """The sender's socket buffer: ``SNDBUF_S`` of the link's rate, in emulated time. Under
    dilation the rate is K times lower and the round trip K times longer, so the bytes in
    flight (the bandwidth-delay product) are K = 1's: the buffer keeps them. Undilated, a
    50 Mbit/s, 50 ms link at K = 4 was held to 73 % of its rate by its own buffer."""
    lo, hi = SNDBUF_RANGE
    if rate_mbit is None:
        return hi
    return int(min(hi, max(lo, rate_mbit * 1e6 / 8 * SNDBUF_S * time_scale)))


def job_times(t0: float, pings: int, seconds: float, max_latency_ms: float,
              time_scale: float = 1.0) -> dict:
    """Absolute times of one job: pings, bulk start, the measured window's start (``warm``)
    and end, when senders stop, when agents report."""
    settle_s = max_latency_ms / 1e3 + 0.1      # the last ping lands before bulk data starts
    bulk = t0 + (pings + 1) * PING_GAP_S + settle_s
    tail_s = max_latency_ms / 1e3 + 0.3        # keep links busy until the window's last release
    return {"t0": t0, "bulk": bulk, "warm": bulk + warmup_s(seconds, time_scale),
            "end": bulk + seconds, "stop": bulk + seconds + tail_s,
            "report": bulk + seconds + tail_s + 0.2}


# ---------------------------------------------------------------- the agent (runs in a namespace)

def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


class _Agent:
    """One worker's end of the probe: listener, receive threads, release thread, senders."""

    def __init__(self, rank: int, host: str, spec: dict | None):
        self.rank = rank
        self.shaper = shaping_from_spec(spec, rank)
        self.rq = ReleaseQueue(self.shaper)
        self.records: dict[int, dict[int, dict[str, list]]] = {}
        self.sent: dict[int, dict[str, dict | None]] = {}   # job -> peer -> tcpinfo.shares
        self.lock = threading.Lock()
        self.listener = socket.create_server((host, 0), backlog=256)
        for target in (self._accept_loop, self._release_loop):
            threading.Thread(target=target, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            conn, _ = self.listener.accept()    # no SO_RCVBUF: it would cap autotuning at rmem_max
            threading.Thread(target=self._read_loop, args=(conn,), daemon=True).start()

    def _read_loop(self, conn: socket.socket) -> None:
        hdr, payload = memoryview(bytearray(HDR.size)), bytearray(MSG_BYTES_RANGE[1])
        try:
            while _recv_exact(conn, hdr):
                kind, src, job, sent, deliver, nbytes = HDR.unpack(hdr)
                if nbytes > len(payload) or not _recv_exact(conn, memoryview(payload)[:nbytes]):
                    break
                deliver_at = None if math.isnan(deliver) else deliver
                # goodput counts what the application moved: header and payload
                self.rq.push(src, deliver_at, time.time(), (job, kind, sent, HDR.size + nbytes))
        except OSError:
            pass    # the sender resets its connection at the end of a job
        finally:
            conn.close()

    def _release_loop(self) -> None:
        while True:
            for src, (job, kind, sent, nbytes), _ in self.rq.wait(1.0):
                now = time.time()
                with self.lock:
                    rec = self.records.get(job, {}).get(src)
                    if rec is not None:
                        rec["lat" if kind == PING else "bulk"].append((now - sent, now, nbytes))

    def run_job(self, job: dict) -> dict:
        with self.lock:
            self.records[job["id"]] = {int(s): {"lat": [], "bulk": []} for s in job["expect"]}
            self.sent[job["id"]] = {}
        errors: list[str] = []
        senders = [threading.Thread(target=self._send, args=(job, int(j), t, errors), daemon=True)
                   for j, t in job["targets"].items()]
        for th in senders:
            th.start()
        time.sleep(max(0.0, job["times"]["report"] - time.time()))
        for th in senders:
            th.join(timeout=5.0)
        with self.lock:
            recs, sent = self.records.pop(job["id"]), self.sent.pop(job["id"])
        return {"rank": self.rank, "errors": errors, "tx": sent,
                "rx": {str(s): _summarise(r, job["times"]) for s, r in recs.items()}}

    def _send(self, job: dict, peer: int, target: dict, errors: list[str]) -> None:
        try:
            sock = socket.create_connection((target["host"], target["port"]), timeout=10.0)
        except OSError as exc:
            errors.append(f"{self.rank}->{peer}: cannot connect to {target['host']}: {exc}")
            return
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # a send buffer of SNDBUF_S at the link's rate keeps the link busy while this thread
        # waits for a CPU (autotuning sizes it from cwnd, which a tiny RTT keeps small)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, target["sndbuf"])
        try:
            self._pings(sock, job, peer, target["ping_offset_s"])
            self._bulk(sock, job, peer, target)
        except OSError as exc:
            errors.append(f"{self.rank}->{peer}: {exc}")
        finally:
            # RST instead of FIN: data still queued is dropped, so it cannot spill into the next job
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()

    def _frame(self, buf: bytearray, kind: int, job: int, peer: int, nbytes: int) -> None:
        now = time.time()
        deliver = self.shaper.stamp(peer, HDR.size + nbytes, now) if self.shaper else None
        HDR.pack_into(buf, 0, kind, self.rank, job, now,
                      math.nan if deliver is None else deliver, nbytes)

    def _pings(self, sock: socket.socket, job: dict, peer: int, offset_s: float) -> None:
        buf = bytearray(HDR.size + PING_BYTES)
        for i in range(job["pings"]):
            time.sleep(max(0.0, job["times"]["t0"] + offset_s + i * PING_GAP_S - time.time()))
            self._frame(buf, PING, job["id"], peer, PING_BYTES)
            sock.sendall(buf)

    def _bulk(self, sock: socket.socket, job: dict, peer: int, target: dict) -> None:
        size, budget, times = target["msg_bytes"], target["max_bytes"], job["times"]
        buf, sent = bytearray(HDR.size + size), 0
        time.sleep(max(0.0, times["bulk"] - time.time()))
        # the kernel's account of this sender over the window the receiver measures
        lo = times["warm"]
        first = last = None
        while time.time() < times["stop"] and sent < budget:
            self._frame(buf, BULK, job["id"], peer, size)
            sock.sendall(buf)
            sent += size
            now = time.time()
            if first is None and now >= lo:
                first = tcpinfo.read(sock)
            if last is None and now >= times["end"]:
                last = tcpinfo.read(sock)
        with self.lock:
            self.sent[job["id"]][str(peer)] = tcpinfo.shares(first, last)


def goodput_mbit(points: list[tuple[float, int]], lo: float, hi: float) -> float:
    """Goodput from (release time, bytes) of the messages released inside [lo, hi].

    The slope of cumulative bytes over time (least squares) when there are enough messages:
    a receiver that loses the CPU for a moment and then catches up bunches its release times,
    which moves bytes across a window edge when counting but barely tilts the fitted line.
    """
    inside = sorted((t, n) for t, n in points if lo <= t <= hi)
    total = sum(n for _, n in inside)
    if len(inside) < MIN_FIT_POINTS:
        return total * 8 / (hi - lo) / 1e6
    xs = [t for t, _ in inside]
    ys = list(itertools.accumulate(n for _, n in inside))
    return statistics.linear_regression(xs, ys).slope * 8 / 1e6


def _summarise(rec: dict, times: dict) -> dict:
    """Latency (ms) of the pings and goodput (Mbit/s) of what was released inside the window."""
    lo = times["warm"]
    points = [(t, n) for _, t, n in rec["bulk"]]
    lats = sorted(lat * 1e3 for lat, _, _ in rec["lat"])
    return {"pings": len(lats), "latency_ms": statistics.median(lats) if lats else None,
            "latency_p90_ms": lats[int(0.9 * (len(lats) - 1))] if lats else None,
            "bytes": sum(n for t, n in points if lo <= t <= times["end"]),
            "mbit": goodput_mbit(points, lo, times["end"])}


def agent_main() -> int:
    """``python -m netem.probe agent``: config line in, port out, then one result per job line."""
    cfg = json.loads(sys.stdin.readline())
    agent = _Agent(cfg["rank"], cfg["host"], cfg.get("spec"))
    print(json.dumps({"port": agent.listener.getsockname()[1]}), flush=True)
    for line in sys.stdin:
        print(json.dumps(agent.run_job(json.loads(line))), flush=True)
    return 0


# ---------------------------------------------------------------- the orchestrator

class _AgentProc:
    """A running agent: its process, and its stdout lines arriving on a queue."""

    def __init__(self, session, rank: int):
        from netem.namespaces import die_with_parent
        argv = session.wrap(rank, [sys.executable, "-m", "netem.probe", "agent"])
        self.rank = rank
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.send({"rank": rank, "host": session.address(rank), "spec": session.shaping_spec()})

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, obj: dict) -> None:
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def read(self, deadline: float) -> dict:
        try:
            line = self.lines.get(timeout=max(0.01, deadline - time.time()))
        except queue.Empty:
            line = None
        if line is None:
            raise ProbeError(f"probe agent of worker {self.rank} did not answer: {self._stderr()}")
        return json.loads(line)

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return "timed out"
        tail = self.proc.stderr.read().strip().splitlines()
        return tail[-1] if tail else f"exit {self.proc.returncode}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()


def _configured(plan, src: int, dst: int) -> tuple[float | None, float]:
    if not plan.shaped:
        return None, 0.0
    return plan.effective_rate_mbit(src, dst), plan.links[(src, dst)].latency_ms


def _job(plan, session, ports: dict, job_id: int, pairs: list, pings: int, seconds: float,
         time_scale: float) -> dict:
    """Per agent: what to send where. Returns {rank: job}."""
    lat = max((_configured(plan, s, d)[1] for s, d in pairs), default=0.0)
    times = job_times(time.time() + START_MARGIN_S, pings, seconds, lat, time_scale)
    jobs = {}
    for s, d in pairs:
        rate = _configured(plan, s, d)[0]
        budget = BUDGET_SLACK_B + math.ceil(2 * (rate or UNSHAPED_RATE_MBIT) * 1e6 / 8
                                            * (times["stop"] - times["t0"]))
        for rank in (s, d):
            jobs.setdefault(rank, {"id": job_id, "pings": pings, "times": times, "targets": {},
                                   "expect": []})
        # stagger the links' pings across the gap so that they do not all fire at once
        offset_s = PING_GAP_S * len(jobs[s]["targets"]) / max(1, plan.workers - 1)
        jobs[s]["targets"][str(d)] = {"host": session.address(d), "port": ports[d],
                                      "msg_bytes": msg_bytes(rate), "max_bytes": budget,
                                      "ping_offset_s": offset_s,
                                      "sndbuf": sndbuf_bytes(rate, time_scale)}
        jobs[d]["expect"].append(s)
    return jobs


def _row(plan, src: int, dst: int, rx: dict) -> dict:
    rate, lat = _configured(plan, src, dst)
    ratio = rx["mbit"] / rate if rate else None
    lat_ok = rx["latency_ms"] is not None and \
        abs(rx["latency_ms"] - lat) <= max(TOLERANCE * lat, LATENCY_TOLERANCE_MS)
    ok = lat_ok and (ratio is None or abs(ratio - 1) <= TOLERANCE)
    return {"src": src, "dst": dst, "configured_mbit": rate, "measured_mbit": round(rx["mbit"], 4),
            "ratio": None if ratio is None else round(ratio, 4), "configured_latency_ms": lat,
            "measured_latency_ms": None if rx["latency_ms"] is None else round(rx["latency_ms"], 3),
            "latency_p90_ms": (None if rx["latency_p90_ms"] is None
                               else round(rx["latency_p90_ms"], 3)),
            "bytes": rx["bytes"], "ok": ok}


def _check_args(pairs: list, workers: int, seconds: float, pings: int) -> None:
    if not 0.2 <= seconds <= 60:
        raise ValueError(f"seconds_per_link = {seconds!r} is out of range; expected [0.2, 60]")
    if not 1 <= pings <= 1000:
        raise ValueError(f"pings = {pings!r} is out of range; expected 1..1000")
    for s, d in pairs:
        if s == d or not (0 <= s < workers and 0 <= d < workers):
            raise ValueError(f"pair ({s}, {d}) is not a link of this run "
                             f"(workers 0..{workers - 1})")


def probe_links(session, pairs: list[tuple[int, int]] | None = None, seconds_per_link: float = 2.0,
                parallel: bool = True, pings: int = 10, time_scale: float = 1.0) -> list[dict]:
    """Measure ``pairs`` (default: every directed link) of a running ``NetworkSession``; one row
    each. ``time_scale``: the run's K, whose links are K times slower and longer (the warm-up
    skipped before goodput is read lasts K times longer too)."""
    plan = session.plan
    pairs = [tuple(p) for p in (pairs if pairs is not None else
             [(i, j) for i in range(plan.workers) for j in range(plan.workers) if i != j])]
    _check_args(pairs, plan.workers, seconds_per_link, pings)
    if not pairs:
        return []   # one worker: no links
    ranks = sorted({r for p in pairs for r in p})
    agents = {}
    try:
        for r in ranks:
            agents[r] = _AgentProc(session, r)
        ports = {r: a.read(time.time() + 30.0)["port"] for r, a in agents.items()}
        rounds = [pairs] if parallel else [[p] for p in pairs]
        rows = []
        for job_id, round_pairs in enumerate(rounds):
            rows += _run_round(plan, session, agents, ports, job_id, round_pairs, pings,
                               seconds_per_link, time_scale)
        return rows
    finally:
        for a in agents.values():
            a.stop()


def _run_round(plan, session, agents, ports, job_id, pairs, pings, seconds,
               time_scale) -> list[dict]:
    jobs = _job(plan, session, ports, job_id, pairs, pings, seconds, time_scale)
    before = cpu_times()
    for rank, job in jobs.items():
        agents[rank].send(job)
    deadline = next(iter(jobs.values()))["times"]["report"] + 10.0
    results = {rank: agents[rank].read(deadline) for rank in jobs}
    errors = [e for r in results.values() for e in r["errors"]]
    if errors:
        raise ProbeError("; ".join(errors))
    cpu = cpu_shares(before, cpu_times())
    # who held each link back: its sender's kernel account, and the host's steal meanwhile
    return [_row(plan, s, d, results[d]["rx"][str(s)])
            | {"sender": results[s]["tx"].get(str(d)), "host_steal": cpu and cpu["steal"]}
            for s, d in pairs]


if __name__ == "__main__":
    if sys.argv[1:] != ["agent"]:
        sys.exit("usage: python -m netem.probe agent   (started by netem.probe.probe_links)")
    sys.exit(agent_main())
