"""The TCP link model (``netem.tcpmodel``) against real TCP through the project's packet line.

    python benchmarks/bench_tcpmodel.py --rates 20,50 --delays-ms 25,50 --sizes-mb 0.5,2 \\
        --cc cubic,bbr --ssai 1,0 --loss-pct 0 --reps 4 --out benchmarks/data/tcpmodel_grid.jsonl
    python benchmarks/bench_tcpmodel.py --report --out benchmarks/data/tcpmodel_grid.jsonl

Each grid cell (rate, one-way delay, message size, congestion control, slow start after idle,
loss) runs in its own user, network and mount namespace (``unshare -Urnm``), in the lab of
``tests/net/test_packetline.py``: two worker namespaces, the sender's eth0 shaped by HTB at the
rate (netem.commands' rates: the rate is goodput), the packet line between them delaying each
direction by the one-way delay and dropping ``loss`` of the data direction's packets.
``tcp_slow_start_after_idle`` is written in the sender's namespace, the congestion control is
set on the sender's socket (TCP_CONGESTION), both sockets have TCP_NODELAY (as ZeroMQ's).

On one connection the sender sends ``1 + reps`` messages, each ``--idle-s`` after the previous
one's end came back; the receiver reads the whole message and answers one byte. A message's
time is the kernel's receive stamp of that byte at the sender (SO_TIMESTAMPNS) less the time the
first byte was offered (time.time() before sendall) less the one-way delay of the answer: from
the first byte offered to the last byte received. The model is given the same sequence (the
measured offer times) and predicts each message (``TcpConnection.transfer``, parameters from
``params_for`` as the simulator builds them).

One JSON row per cell is appended to ``--out`` as the cell finishes, with the measured and
predicted times of every message; a cell already in the file is skipped (resume). The first
message opens the connection (no idle before it): the table compares the median over the
others (the after-idle messages), and prints the summary: median and worst |predicted /
measured - 1|. Predictions are recomputed from the current model when the table is printed, so
``--report`` re-judges a changed model against the stored measurements.

Bounds: at most ``--reps`` + 1 messages a cell, a cell stops sending once it has run
``--cell-timeout-s`` x 0.7 and is killed at ``--cell-timeout-s``; the grid stops starting cells
after ``--total-timeout-s``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.abspath(__file__)
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [REPO, os.path.join(REPO, "tests", "net")]

from netem.tcpmodel import TcpConnection, params_for  # noqa: E402
from netem.tcpsettings import HostTcp, TcpSettings  # noqa: E402

LAB_BUF_BYTES = 16 << 20        # the lab's tcp_rmem / tcp_wmem maxima (test_packetline.Lab)
PORT = 43_000
TARGET_MEDIAN, TARGET_WORST = 0.10, 0.25
KEYS = ("rate_mbit", "delay_ms", "size_mb", "cc", "ssai", "loss_pct")
SETUP_S = 8.0                   # namespaces, the line, ARP and the handshake


# ---------------------------------------------------------------- inside the namespaces

def _receiver(sock: socket.socket, nbytes: int, messages: int, timeout_s: float) -> None:
    """Read each whole message, then answer one byte."""
    buf = memoryview(bytearray(1 << 20))
    sock.settimeout(timeout_s)
    for _ in range(messages):
        left = nbytes
        while left:
            n = sock.recv_into(buf, min(left, len(buf)))
            if not n:
                return
            left -= n
        sock.sendall(b"k")


def _answer_stamp(sock: socket.socket) -> float:
    """The kernel's receive stamp (CLOCK_REALTIME) of the receiver's one-byte answer."""
    from netem.packetline import SO_TIMESTAMPNS, TIMESPEC
    data, anc, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(TIMESPEC.size))
    if not data:
        raise ConnectionError("the receiver closed the connection")
    stamp = [TIMESPEC.unpack_from(d) for _, kind, d in anc if kind == SO_TIMESTAMPNS]
    return stamp[0][0] + stamp[0][1] * 1e-9 if stamp else time.time()


# struct tcp_info (include/uapi/linux/tcp.h): u32 fields' byte offsets
TCP_INFO_AT = {"rto_us": 8, "rtt_us": 68, "rttvar_us": 72, "snd_ssthresh": 76,
               "snd_cwnd": 80}


def _tcp_state(sock: socket.socket) -> dict:
    """The sender's RTO, RTT, RTT variance, ssthresh and cwnd as the kernel has them."""
    from test_packetline import tcp_info_u32
    return {k: tcp_info_u32(sock, at) for k, at in TCP_INFO_AT.items()}


def run_cell(cell: dict) -> dict:
    """One cell inside its own namespaces: every message's offer time and measured time."""
    from test_packetline import TCP_INFO_TOTAL_RETRANS_AT, Lab, tcp_info_u32, tcp_pair, warm_up

    from netem.impair import Impairment
    from netem.packetline import SO_TIMESTAMPNS
    t_begin = time.monotonic()
    budget_s = 0.7 * cell["cell_timeout_s"]
    lab = Lab(2, cell["workdir"], tcp_buf_bytes=LAB_BUF_BYTES)
    lab.shape(0, cell["rate_mbit"])
    lab._sysctl("w0", "net/ipv4/tcp_slow_start_after_idle", str(cell["ssai"]))
    delay_ms = cell["delay_ms"]
    lab.start_line({(0, 1): Impairment(delay_ms=delay_ms, loss_pct=cell["loss_pct"]),
                    (1, 0): Impairment(delay_ms=delay_ms)}, seed=cell.get("seed", 1))
    warm_up(lab, [(0, 1), (1, 0)])
    c, s = tcp_pair(lab, 0, 1, PORT)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cell["cc"].encode())
    for sock in (c, s):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    c.settimeout(cell["cell_timeout_s"])
    nbytes, messages = round(cell["size_mb"] * 1e6), 1 + cell["reps"]
    rx = threading.Thread(target=_receiver, daemon=True,
                          args=(s, nbytes, messages, cell["cell_timeout_s"]))
    rx.start()
    payload = memoryview(bytearray(os.urandom(1 << 16)) * (nbytes // (1 << 16) + 1))[:nbytes]
    starts, measured, first, states = [], [], None, []
    for _ in range(messages):
        if time.monotonic() - t_begin > budget_s:
            break
        states.append(_tcp_state(c))      # before the message: after the idle time
        t0 = time.time()
        first = t0 if first is None else first
        c.sendall(payload)
        t1 = _answer_stamp(c)
        starts.append(t0 - first)
        measured.append(t1 - t0 - delay_ms / 1e3)
        time.sleep(cell["idle_s"])
    retrans = tcp_info_u32(c, TCP_INFO_TOTAL_RETRANS_AT)
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        host_cc = f.read().strip()      # (the lab's own namespace: for the record)
    c.close()
    rx.join(5)
    s.close()
    lab.stop_line("term")
    return {"starts_s": starts, "measured_s": measured, "retrans": retrans,
            "tcp_before": states, "lab_default_cc": host_cc}


# ---------------------------------------------------------------- the model

def predict(row: dict) -> list[float]:
    """The model's time for each message of ``row``, offered at its measured times."""
    host = HostTcp(congestion_control=row["cc"], available=(), allowed=(),
                   slow_start_after_idle=row["ssai"], rmem=(4096, 131072, LAB_BUF_BYTES),
                   wmem=(4096, 131072, LAB_BUF_BYTES))
    params = params_for(TcpSettings(row["cc"], row["ssai"]), host, loss_pct=row["loss_pct"])
    conn = TcpConnection(params, row["rate_mbit"], 2 * row["delay_ms"] / 1e3)
    nbytes = round(row["size_mb"] * 1e6)
    return [conn.transfer(nbytes, t).total_s for t in row["starts_s"]]


def judged(row: dict) -> dict:
    """Measured and predicted medians of the after-idle messages (the first where alone)."""
    pred = predict(row)
    meas = row["measured_s"]
    after = slice(1, None) if len(meas) > 1 else slice(0, None)
    m, p = statistics.median(meas[after]), statistics.median(pred[after])
    line_s = row["size_mb"] * 8 / row["rate_mbit"] + row["delay_ms"] / 1e3
    return {"measured": m, "predicted": p, "ratio": p / m, "first_m": meas[0],
            "first_p": pred[0], "line_ratio": m / line_s}


# ---------------------------------------------------------------- outside

def cell_key(cell: dict) -> tuple:
    return tuple(float(cell[k]) if k not in ("cc",) else cell[k] for k in KEYS)


def _cell_in_userns(cell: dict) -> dict:
    argv = ["unshare", "-Urnm", "--", sys.executable, HERE, "--cell", json.dumps(cell)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO,
                              timeout=cell["cell_timeout_s"] + SETUP_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {cell['cell_timeout_s'] + SETUP_S:g} s"}
    found = [x[len("CELL "):] for x in proc.stdout.splitlines() if x.startswith("CELL ")]
    if proc.returncode or not found:
        return {"error": f"failed ({proc.returncode}): {proc.stderr.strip()[-400:]}"}
    return json.loads(found[-1])


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _load(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _label(row: dict) -> str:
    return (f"{row['rate_mbit']:g}M {row['delay_ms']:g}ms {row['size_mb']:g}MB {row['cc']} "
            f"ssai={row['ssai']} loss={row['loss_pct']:g}%")


def print_table(rows: list[dict]) -> dict:
    ok = [r for r in rows if "error" not in r and r.get("measured_s")]
    print("\ncell | measured median s | predicted s | predicted/measured | measured/line "
          "| first message meas/pred s | retrans")
    errors = []
    for r in sorted(ok, key=cell_key):
        j = judged(r)
        errors.append((abs(j["ratio"] - 1), _label(r)))
        flag = "" if abs(j["ratio"] - 1) <= TARGET_WORST else "  <-- out of 25 %"
        print(f"{_label(r)} | {j['measured']:.4f} | {j['predicted']:.4f} | {j['ratio']:.3f} | "
              f"{j['line_ratio']:.2f} | {j['first_m']:.3f}/{j['first_p']:.3f} | "
              f"{r.get('retrans', '?')}{flag}")
    for r in rows:
        if "error" in r:
            print(f"{_label(r)} | {r['error']}")
    if not errors:
        print("no measured cells")
        return {}
    med = statistics.median(e for e, _ in errors)
    worst = max(errors)
    print(f"\n{len(errors)} cells: median |predicted/measured - 1| = {med:.3f} (target "
          f"{TARGET_MEDIAN:g}), worst = {worst[0]:.3f} at {worst[1]} (target {TARGET_WORST:g}); "
          f"{sum(e > TARGET_WORST for e, _ in errors)} cells beyond {TARGET_WORST:g}, "
          f"{sum(e > TARGET_MEDIAN for e, _ in errors)} beyond {TARGET_MEDIAN:g}")
    return {"median": med, "worst": worst[0]}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--cell"]:
        print("CELL " + json.dumps(run_cell(json.loads(argv[1]))), flush=True)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="20,50,100", help="Mbit/s, comma-separated")
    ap.add_argument("--delays-ms", default="25,50", help="one-way delays")
    ap.add_argument("--sizes-mb", default="0.5,2,8")
    ap.add_argument("--cc", default="cubic,bbr")
    ap.add_argument("--ssai", default="1,0", help="tcp_slow_start_after_idle values")
    ap.add_argument("--loss-pct", default="0")
    ap.add_argument("--reps", type=int, default=4, help="after-idle messages per cell")
    ap.add_argument("--idle-s", type=float, default=1.0,
                    help="idle before each message (must exceed the RTO, RTT + 0.2 s)")
    ap.add_argument("--cell-timeout-s", type=float, default=120.0)
    ap.add_argument("--total-timeout-s", type=float, default=1500.0)
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "data",
                                                  "tcpmodel_grid.jsonl"))
    ap.add_argument("--report", action="store_true", help="only print the table of --out")
    args = ap.parse_args(argv)
    if args.report:
        print_table(_load(args.out))
        return 0
    reps = max(1, min(50, args.reps))
    idle_s = max(0.0, min(10.0, args.idle_s))
    done = {cell_key(r) for r in _load(args.out) if "error" not in r}
    grid = itertools.product(_floats(args.rates), _floats(args.delays_ms),
                             _floats(args.sizes_mb), args.cc.split(","),
                             [int(x) for x in _floats(args.ssai)], _floats(args.loss_pct))
    t_end = time.monotonic() + args.total_timeout_s
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    for rate, delay, size, cc, ssai, loss in grid:
        cell = {"rate_mbit": rate, "delay_ms": delay, "size_mb": size, "cc": cc, "ssai": ssai,
                "loss_pct": loss}
        if cell_key(cell) in done:
            continue
        if time.monotonic() > t_end:
            print(f"total timeout: {_label(cell)} and later cells not run", flush=True)
            break
        cell |= {"reps": reps, "idle_s": idle_s, "cell_timeout_s": args.cell_timeout_s}
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="bench-tcp-") as workdir:
            got = _cell_in_userns(cell | {"workdir": workdir})
        row = cell | got | {"wall_s": round(time.monotonic() - t0, 1),
                            "loadavg_1m": round(load, 2)}
        if "error" not in row and not row.get("measured_s"):
            row["error"] = "no message finished within the cell's time"
        if "error" not in row:
            row["predicted_s"] = predict(row)
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(_label(row), "->", row.get("error") or
              f"measured {[round(x, 4) for x in row['measured_s']]} predicted "
              f"{[round(x, 4) for x in row['predicted_s']]}", flush=True)
    print_table(_load(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
