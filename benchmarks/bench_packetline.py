"""The packet delay line's capacity: aggregate TCP goodput through it against how punctual it stays.

    python benchmarks/bench_packetline.py [--seconds 3] [--delay-ms 10] [--cases 1x200,4x250,4x0]
        [--engines c,python] [--load 2] [--priorities normal,rt]

Each case (``FLOWSxMBIT``, MBIT per flow, 0 = unshaped) runs in its own user, network and mount
namespace (``unshare -Urnm``; skipped, saying why, where that is impossible): FLOWS sender
workers, each shaped by HTB on its eth0 (netem.commands' rates, so MBIT is goodput), send bulk
TCP to FLOWS receiver workers through the packet line, every link delayed by ``--delay-ms``
each way; meanwhile a separate pair of workers exchanges 1,000 UDP probes a second through the
same line. Columns:

- ``goodput``: the sum over flows of what each receiver read after a warm-up, per second;
- ``owd err p50/p99/max``: each probe's one-way delay (sender's time.time() in the payload,
  receiver's kernel stamp) minus the configured delay, in ms: what an application sees;
- ``late p99``: the line's own record of (send - scheduled release), and ``lag p99``: the time
  from the kernel's receive stamp to the line reading the frame;
- ``frames/s`` the line received, their mean size (GSO super-packets are up to 64 KiB), and the
  line's CPU share of one core, user / system (/proc/PID/stat). The system share includes the
  receivers' TCP: a frame the line sends into a veth is processed by the receiving stack in
  the sender's context (veth_xmit -> netif_rx -> softirq on leaving the syscall).

A case ``udpN[@FPS]`` is small frames instead: N sender processes each send 18-byte UDP
datagrams (60-byte frames, no GSO) to their own receiver worker, as fast as they can or FPS
frames a second over all of them; ``delivered/s`` is
what the receivers' kernels counted (/proc/net/snmp Udp InDatagrams + RcvbufErrors: arrived,
read or not), independent of the line's own count.

``--engines c,python`` runs every case with each engine of the line (the compiled core,
netem/_linecore.c, and the pure-Python loop), side by side. ``--load N`` runs N busy-loop
processes beside the line for each case (normal priority, bounded by the case's time);
``--priorities normal,rt`` runs each case with the line at normal priority and at real-time
priority (``chrt -f -p 10``, set from outside the user namespace, which cannot).

The last line names the largest aggregate whose probe error stayed within +-1 ms at p99. Every
case is bounded: ``--seconds`` of traffic plus set-up, a timeout of 60 s.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [REPO, os.path.join(REPO, "tests", "net")]

DEFAULT_CASES = "1x200,4x100,4x250,4x400,4x600,1x0,4x0,udp2@150000,udp2"
PROBE_RATE_HZ = 1000
CASE_TIMEOUT_S = 60.0
WARM_S = 1.0


# ---------------------------------------------------------------- inside the namespace

def _bulk(lab, pairs, seconds: float, port: int) -> list[float]:
    """Light bulk flows (no hashing: the CPU is the line's): receiver goodput in Mbit/s."""
    from test_packetline import tcp_pair
    conns = [tcp_pair(lab, s, d, port + i) for i, (s, d) in enumerate(pairs)]
    stop_at = time.monotonic() + seconds
    goodput = [0.0] * len(conns)
    chunk = os.urandom(1 << 20)

    def send(sock):
        while time.monotonic() < stop_at:
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)

    def recv(i, sock):
        buf, start, got, last = bytearray(1 << 20), time.monotonic() + WARM_S, 0, None
        sock.settimeout(seconds + 10)
        while True:
            n = sock.recv_into(buf)
            if not n:
                break
            now = time.monotonic()
            if start <= now <= stop_at:
                got, last = got + n, now
        goodput[i] = got * 8 / (last - start) / 1e6 if last and last > start else 0.0
    threads = []
    for i, (c, s) in enumerate(conns):
        threads += [threading.Thread(target=send, args=(c,), daemon=True),
                    threading.Thread(target=recv, args=(i, s), daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 20)
    for c, s in conns:
        c.close()
        s.close()
    return goodput


SMALL_PAYLOAD = bytes(18)              # + 8 UDP + 20 IP + 14 Ethernet = a 60-byte frame


def _small_udp(lab, pairs, seconds: float, port: int, rate_fps: float = 0.0) -> list[float]:
    """One forked sender process per pair, small datagrams for ``seconds``, as fast as it can
    or, with ``rate_fps``, paced to that many frames a second over all senders (in bursts of
    64 every 64 / rate); the UDP payload the senders offered (Mbit/s), per pair."""
    from test_packetline import address
    rxs, pids = [], []
    for i, (s, d) in enumerate(pairs):
        rx = lab.socket(d)
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        rx.bind((address(d), port + i))
        rxs.append(rx)
        tx = lab.socket(s)
        tx.connect((address(d), port + i))
        pid = os.fork()
        if pid == 0:                      # the child: bounded by time, then gone
            start = time.monotonic()
            stop_at, sent, burst = start + seconds, 0, 64
            gap_s = burst * len(pairs) / rate_fps if rate_fps else 0.0
            try:
                while time.monotonic() < stop_at:
                    if gap_s:
                        wait = start + (sent // burst) * gap_s - time.monotonic()
                        if wait > 0:
                            time.sleep(wait)
                    for _ in range(burst):
                        try:
                            tx.send(SMALL_PAYLOAD)
                            sent += 1
                        except BlockingIOError:
                            pass
            finally:
                os._exit(0)
        tx.close()
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    for rx in rxs:
        rx.close()
    return [0.0 for _ in pairs]


def _udp_in(lab, rank: int) -> int:
    """UDP datagrams that reached worker ``rank`` (read or dropped at a full socket)."""
    from test_packetline import snmp
    udp = snmp(lab, rank)["Udp"]
    return udp["InDatagrams"] + udp["RcvbufErrors"]


def _cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process (proc(5): utime, stime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))] if s else float("nan")


def run_case(case: dict) -> dict:
    """One case inside its own namespaces; the row."""
    from test_packetline import Lab, udp_probe, warm_up

    from netem.impair import Impairment
    flows, rate, delay = case["flows"], case["rate_mbit"], case["delay_ms"]
    udp = case.get("kind") == "udp"
    lab = Lab(2 * flows + 2, case["workdir"], engine=case.get("engine", "auto"))
    if rate and not udp:
        for k in range(flows):
            lab.shape(k, rate)
    lab.start_line({}, default=Impairment(delay_ms=delay))
    pairs = [(k, flows + k) for k in range(flows)]
    probe = (2 * flows, 2 * flows + 1)
    warm_up(lab, pairs + [(d, s) for s, d in pairs] + [probe])
    box: dict = {}
    count = int((case["seconds"] - WARM_S) * PROBE_RATE_HZ)

    def probing():
        time.sleep(WARM_S)
        box["probe"] = udp_probe(lab, *probe, count, 1 / PROBE_RATE_HZ, max_delay_s=2.0)
    with open(lab.spec.ready_path) as f:
        pid = int(json.load(f)["pid"])
    # the outside sets the priority and starts the load; it answers when done
    print(f"LINEPID {pid}", flush=True)
    sys.stdin.readline()
    t = threading.Thread(target=probing, daemon=True)
    before = lab.control({"op": "stats"})["stats"]
    snmp0 = [_udp_in(lab, d) for _, d in pairs] if udp else []
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    t.start()
    if udp:
        goodput = _small_udp(lab, pairs, case["seconds"], 43_000, case.get("rate_fps", 0.0))
    else:
        goodput = _bulk(lab, pairs, case["seconds"], 42_000)
    t.join(case["seconds"] + 10)
    cpu1, t1 = _cpu_s(pid), time.monotonic()
    time.sleep(delay / 1e3 + 0.05)          # what the line holds arrives
    delivered = sum(_udp_in(lab, d) for _, d in pairs) - sum(snmp0) if udp else None
    after = lab.stop_line()["stats"]
    errors = [d - delay for d in box.get("probe", {}).get("delays_ms", [])]
    frames = after["frames"]["received"] - before["frames"]["received"]
    in_bytes = sum(x["counters"]["admitted_bytes"] for x in after["links"]) - \
        sum(x["counters"]["admitted_bytes"] for x in before["links"])
    name = (f"udp{flows}@{case['rate_fps'] or 'max'}" if udp
            else f"{flows}x{rate or 'unshaped'}")
    return {"case": name, "flows": flows, "rate_mbit": rate,
            "engine": after.get("engine", "python"), "priority": case.get("priority", "normal"),
            "load": case.get("load", 0),
            "delivered_per_s": round(delivered / (t1 - t0)) if udp else None,
            "late_p50_ms": after["late_release"]["p50_ms"],
            "late_max_ms": after["late_release"]["max_ms"],
            "goodput_mbit": round(sum(goodput), 1),
            "probes": f"{len(errors)}/{count}",
            "owd_err_ms": [round(_percentile(errors, q), 3) for q in (0.5, 0.99, 1.0)],
            "late_p99_ms": after["late_release"]["p99_ms"],
            "lag_p99_ms": after["read_lag"]["p99_ms"],
            "frames_per_s": round(frames / (t1 - t0)),
            "mean_frame_b": round(in_bytes / frames) if frames else 0,
            "line_cpu": [round((b - a) / (t1 - t0), 2) for a, b in zip(cpu0, cpu1, strict=True)],
            "drops": {k: v for k, v in after["frames"].items()
                      if k in ("send_errors", "truncated") and v}}


# ---------------------------------------------------------------- outside

BUSY = "import time\nt = time.monotonic() + {s}\nwhile time.monotonic() < t:\n    pass\n"


def _case_in_userns(case: dict) -> dict | str:
    """Run one case; when its line is up, set its priority and start the load from here."""
    proc = subprocess.Popen(["unshare", "-Urnm", "--", sys.executable, HERE, "--case",
                             json.dumps(case)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    timer = threading.Timer(CASE_TIMEOUT_S, proc.kill)
    timer.start()
    busy: list[subprocess.Popen] = []
    rows, note = [], ""
    try:
        for line in proc.stdout:
            if line.startswith("LINEPID "):
                pid = int(line.split()[1])
                if case.get("priority") == "rt":
                    rt = subprocess.run(["chrt", "-f", "-p", "10", str(pid)],
                                        capture_output=True, text=True, timeout=10)
                    if rt.returncode != 0:
                        note = f"chrt failed: {rt.stderr.strip()}"
                busy = [subprocess.Popen([sys.executable, "-c",
                                          BUSY.format(s=case["seconds"] + 3)])
                        for _ in range(case.get("load", 0))]
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif line.startswith("ROW "):
                rows.append(line)
        err = proc.stderr.read()
        proc.wait(10)
    finally:
        timer.cancel()
        for b in busy:
            b.kill()
            b.wait(5)
    if not timer.finished.is_set() and proc.returncode is None:
        proc.kill()
    if note:
        return note
    if proc.returncode != 0 or not rows:
        return f"failed ({proc.returncode}): {err.strip()[-400:]}"
    return json.loads(rows[-1][4:])


def _parse_cases(text: str) -> list[tuple[str, int, float]]:
    """(kind, flows, Mbit/s per flow or frames/s in all) of FLOWSxMBIT (TCP) or udpN[@FPS]
    (N small-frame senders, as fast as they can or FPS frames a second in all)."""
    out = []
    for item in text.lower().split(","):
        if item.startswith("udp"):
            senders, _, fps = item[3:].partition("@")
            out.append(("udp", max(1, min(4, int(senders or 2))), max(0.0, float(fps or 0))))
            continue
        flows, rate = item.split("x")
        out.append(("tcp", max(1, min(8, int(flows))), max(0.0, float(rate))))
    return out


def _print(rows: list[dict], delay_ms: float) -> None:
    head = ("case", "engine", "prio", "load", "goodput", "delivered/s", "probes",
            "owd err p50/p99/max", "late p50/p99/max", "lag p99", "frames/s", "mean B",
            "line cpu usr/sys")
    print(f"\npacket line, every link {delay_ms:g} ms each way (goodput in Mbit/s, times in ms)")
    print(" | ".join(head))
    for r in rows:
        if "error" in r:
            print(f"{r['case']} | {r['error']}")
            continue
        e = r["owd_err_ms"]
        print(" | ".join(str(x) for x in (
            r["case"], r["engine"], r["priority"], r["load"],
            "-" if r["delivered_per_s"] is not None else r["goodput_mbit"],
            r["delivered_per_s"] if r["delivered_per_s"] is not None else "-",
            r["probes"], f"{e[0]}/{e[1]}/{e[2]}",
            f"{r['late_p50_ms']}/{r['late_p99_ms']}/{r['late_max_ms']}",
            r["lag_p99_ms"], r["frames_per_s"], r["mean_frame_b"],
            "/".join(map(str, r["line_cpu"])))) + (f" | {r['drops']}" if r["drops"] else ""))
    for engine in sorted({r["engine"] for r in rows if "error" not in r}):
        ok = [r for r in rows if "error" not in r and r["engine"] == engine
              and abs(r["owd_err_ms"][1]) <= 1.0 and r["owd_err_ms"][0] >= -0.05]
        best = max(ok, key=lambda r: r["goodput_mbit"], default=None)
        fast = max(ok, key=lambda r: r["frames_per_s"], default=None)
        print(f"\n{engine}: largest aggregate with one-way delay within +-1 ms at p99: "
              + (f"{best['goodput_mbit']} Mbit/s ({best['case']})" if best else "none")
              + "; most frames/s so: "
              + (f"{fast['frames_per_s']} ({fast['case']})" if fast else "none"))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--case"]:
        print("ROW " + json.dumps(run_case(json.loads(argv[1]))), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--delay-ms", type=float, default=10.0)
    ap.add_argument("--cases", default=DEFAULT_CASES,
                    help="FLOWSxMBIT per flow (0: unshaped) or udpN (N small-frame senders), "
                         "comma-separated")
    from netem.packetline import engine_available
    ap.add_argument("--engines", default="c,python" if engine_available() else "python",
                    help="the line's engines to compare: c, python or auto, comma-separated "
                         "(default: both where the compiled one is built)")
    ap.add_argument("--load", type=int, default=0,
                    help="busy-loop processes beside the line (0 to 8)")
    ap.add_argument("--priorities", default="normal",
                    help="the line's priority: normal, rt (chrt -f 10), comma-separated")
    args = ap.parse_args(argv)
    seconds = max(1.5, min(10.0, args.seconds))
    engines = [e for e in args.engines.split(",") if e]
    priorities = [p for p in args.priorities.split(",") if p]
    for what, values, allowed in (("engine", engines, ("auto", "c", "python")),
                                  ("priority", priorities, ("normal", "rt"))):
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            ap.error(f"{what} {bad or values!r} is not allowed; expected some of "
                     f"{', '.join(allowed)}")
    if not 0 <= args.load <= 8:
        ap.error(f"--load {args.load} is out of range; expected 0 to 8")
    rows = []
    import tempfile
    for kind, flows, rate in _parse_cases(args.cases):
        for prio in priorities:
            for engine in engines:
                with tempfile.TemporaryDirectory(prefix="bench-line-") as workdir:
                    row = _case_in_userns({"kind": kind, "flows": flows,
                                           "rate_mbit": rate if kind == "tcp" else 0.0,
                                           "rate_fps": rate if kind == "udp" else 0.0,
                                           "seconds": seconds, "delay_ms": args.delay_ms,
                                           "workdir": workdir, "engine": engine,
                                           "priority": prio, "load": args.load})
                if isinstance(row, str):
                    row = {"case": f"{kind}{flows}x{rate:g}/{engine}/{prio}", "error": row}
                rows.append(row)
                print(json.dumps(row), flush=True)
    _print(rows, args.delay_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
