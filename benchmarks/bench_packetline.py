"""The packet delay line's capacity: aggregate TCP goodput through it against how punctual it stays.

    python benchmarks/bench_packetline.py [--seconds 3] [--delay-ms 10] [--cases 1x200,4x250,4x0]

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

DEFAULT_CASES = "1x200,4x100,4x250,4x400,4x600,1x0,4x0"
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
    lab = Lab(2 * flows + 2, case["workdir"])
    if rate:
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
    t = threading.Thread(target=probing, daemon=True)
    before = lab.control({"op": "stats"})["stats"]
    cpu0, t0 = _cpu_s(pid), time.monotonic()
    t.start()
    goodput = _bulk(lab, pairs, case["seconds"], 42_000)
    t.join(case["seconds"] + 10)
    cpu1, t1 = _cpu_s(pid), time.monotonic()
    after = lab.stop_line()["stats"]
    errors = [d - delay for d in box.get("probe", {}).get("delays_ms", [])]
    frames = after["frames"]["received"] - before["frames"]["received"]
    in_bytes = sum(x["counters"]["admitted_bytes"] for x in after["links"]) - \
        sum(x["counters"]["admitted_bytes"] for x in before["links"])
    return {"case": f"{flows}x{rate or 'unshaped'}", "flows": flows, "rate_mbit": rate,
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

def _case_in_userns(case: dict) -> dict | str:
    try:
        proc = subprocess.run(["unshare", "-Urnm", "--", sys.executable, HERE, "--case",
                               json.dumps(case)], capture_output=True, text=True,
                              timeout=CASE_TIMEOUT_S, cwd=REPO)
    except subprocess.TimeoutExpired:
        return f"timed out after {CASE_TIMEOUT_S:g} s"
    rows = [x for x in proc.stdout.splitlines() if x.startswith("ROW ")]
    if proc.returncode != 0 or not rows:
        return f"failed ({proc.returncode}): {proc.stderr.strip()[-400:]}"
    return json.loads(rows[-1][4:])


def _parse_cases(text: str) -> list[tuple[int, float]]:
    out = []
    for item in text.split(","):
        flows, rate = item.lower().split("x")
        out.append((max(1, min(8, int(flows))), max(0.0, float(rate))))
    return out


def _print(rows: list[dict], delay_ms: float) -> None:
    head = ("case", "goodput", "probes", "owd err p50/p99/max", "late p99", "lag p99",
            "frames/s", "mean B", "line cpu usr/sys")
    print(f"\npacket line, every link {delay_ms:g} ms each way (goodput in Mbit/s, times in ms)")
    print(" | ".join(head))
    for r in rows:
        if "error" in r:
            print(f"{r['case']} | {r['error']}")
            continue
        e = r["owd_err_ms"]
        print(" | ".join(str(x) for x in (
            r["case"], r["goodput_mbit"], r["probes"], f"{e[0]}/{e[1]}/{e[2]}",
            r["late_p99_ms"], r["lag_p99_ms"], r["frames_per_s"], r["mean_frame_b"],
            "/".join(map(str, r["line_cpu"])))) + (f" | {r['drops']}" if r["drops"] else ""))
    ok = [r for r in rows if "error" not in r and abs(r["owd_err_ms"][1]) <= 1.0
          and r["owd_err_ms"][0] >= -0.05]
    best = max(ok, key=lambda r: r["goodput_mbit"], default=None)
    print("\nlargest aggregate with one-way delay within +-1 ms at p99: "
          + (f"{best['goodput_mbit']} Mbit/s ({best['case']})" if best else "none"))


def main(argv: list[str]) -> int:
    if argv[:1] == ["--case"]:
        print("ROW " + json.dumps(run_case(json.loads(argv[1]))), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--delay-ms", type=float, default=10.0)
    ap.add_argument("--cases", default=DEFAULT_CASES,
                    help="FLOWSxMBIT per flow (0: unshaped), comma-separated")
    args = ap.parse_args(argv)
    seconds = max(1.5, min(10.0, args.seconds))
    rows = []
    import tempfile
    for flows, rate in _parse_cases(args.cases):
        with tempfile.TemporaryDirectory(prefix="bench-line-") as workdir:
            row = _case_in_userns({"flows": flows, "rate_mbit": rate, "seconds": seconds,
                                   "delay_ms": args.delay_ms, "workdir": workdir})
        if isinstance(row, str):
            row = {"case": f"{flows}x{rate:g}", "error": row}
        rows.append(row)
        print(json.dumps(row), flush=True)
    _print(rows, args.delay_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
