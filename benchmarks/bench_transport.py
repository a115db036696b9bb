"""Data-plane throughput on loopback: raw pyzmq PUSH/PULL vs ZmqTransport, side by side.

Two processes (a sender and a receiver) run every trial, alternating the paths so that
background load hits all alike:
  raw        PUSH/PULL, one frame of MESSAGE bytes, copy=False on both sides
  open       ZmqTransport.send/recv of a float32 tensor of the same size: msgpack header,
             zero-copy payload, exact validation (schema), mailbox; no authentication
  plain      the same with ZAP PLAIN authentication (the default on one host)
  curve      the same with CURVE: authenticated and encrypted
The transport paths send the algorithms' own messages ("z", the whole model, one per round),
so the default schema checks them. The receiver starts its clock when a warm-up message has
arrived (the connection is up) and stops it after the last of N messages; throughput =
N * bytes / elapsed. The target is plain / raw >= 0.90.

    python benchmarks/bench_transport.py [--mib 64] [--messages 16] [--trials 3]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import time

import numpy as np
import torch
import zmq

from gasloc_emu.transport.auth import RunCredentials, Security
from gasloc_emu.transport.zmq_transport import ZmqTransport

PATHS = ("raw", "open", "plain", "curve")
TARGET_PATH, TARGET_RATIO = "plain", 0.90
TIMEOUT_S = 120.0  # a trial that takes this long is broken, not slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def addr(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


# -- raw pyzmq

def raw_receive(ctx: zmq.Context, port: int, n_msgs: int, barrier) -> float:
    sock = ctx.socket(zmq.PULL)
    sock.bind(addr(port))
    barrier.wait(TIMEOUT_S)
    try:
        sock.recv(copy=False)  # warm-up: the connection is up
        t0 = time.perf_counter()
        for _ in range(n_msgs):
            sock.recv(copy=False)
        return time.perf_counter() - t0
    finally:
        sock.close(linger=0)


def raw_send(ctx: zmq.Context, port: int, n_msgs: int, nbytes: int, barrier) -> None:
    payload = np.ones(nbytes, dtype=np.uint8)
    barrier.wait(TIMEOUT_S)
    sock = ctx.socket(zmq.PUSH)
    sock.connect(addr(port))
    for _ in range(n_msgs + 1):
        sock.send(payload, copy=False)
    sock.close(linger=int(TIMEOUT_S * 1000))  # returns once everything is out


# -- ZmqTransport

def transport_pair(rank: int, ports: tuple[int, int], numel: int, n_msgs: int,
                   security: Security | None) -> ZmqTransport:
    peer = 1 - rank
    # the sender runs up to n_msgs rounds ahead: let the window and the mailbox hold all of them
    return ZmqTransport(rank, 2, addr(ports[rank]), {peer: addr(ports[peer])},
                        max_numel=numel, recv_timeout_s=TIMEOUT_S, linger_s=TIMEOUT_S,
                        max_rounds_ahead=n_msgs + 1, max_msgs_per_peer=n_msgs + 1,
                        max_bytes_per_peer=(n_msgs + 1) * numel * 4, security=security)


def transport_receive(ports: tuple[int, int], n_msgs: int, numel: int, barrier,
                      security: Security | None) -> float:
    with transport_pair(1, ports, numel, n_msgs, security) as tp:
        barrier.wait(TIMEOUT_S)
        tp.recv(0, 0, "z")  # round 0: the warm-up
        t0 = time.perf_counter()
        for t in range(1, n_msgs + 1):
            tp.recv(0, t, "z")
        elapsed = time.perf_counter() - t0
        assert tp.counters()["drop_reasons"] == {}, tp.counters()["drop_reasons"]
        return elapsed


def transport_send(ports: tuple[int, int], n_msgs: int, numel: int, barrier,
                   security: Security | None) -> None:
    tensor = torch.ones(numel, dtype=torch.float32)
    barrier.wait(TIMEOUT_S)
    # close() waits until everything is out
    with transport_pair(0, ports, numel, n_msgs, security) as tp:
        for t in range(n_msgs + 1):
            tp.send(1, t, "z", tensor)  # never modified: the ownership rule holds


def security_for(path: str, creds: RunCredentials) -> Security | None:
    return None if path == "open" else Security(creds, path)


def shared_credentials() -> RunCredentials:
    """The credentials the parent put in the environment (as the launcher does for workers)."""
    return Security.from_env(2).creds


# -- the two processes

def receiver(trials, n_msgs: int, nbytes: int, barrier, results) -> None:
    torch.set_num_threads(1)
    ctx, creds = zmq.Context(), shared_credentials()
    for path, ports in trials:
        if path == "raw":
            elapsed = raw_receive(ctx, ports[1], n_msgs, barrier)
        else:
            elapsed = transport_receive(ports, n_msgs, nbytes // 4, barrier,
                                        security_for(path, creds))
        results.put((path, n_msgs * nbytes / elapsed))
    ctx.term()


def sender(trials, n_msgs: int, nbytes: int, barrier) -> None:
    torch.set_num_threads(1)
    ctx, creds = zmq.Context(), shared_credentials()
    for path, ports in trials:
        if path == "raw":
            raw_send(ctx, ports[1], n_msgs, nbytes, barrier)
        else:
            transport_send(ports, n_msgs, nbytes // 4, barrier, security_for(path, creds))
    ctx.term()


def run(mib: int, n_msgs: int, n_trials: int) -> dict[str, list[float]]:
    nbytes = mib << 20
    trials = [(path, (free_port(), free_port())) for _ in range(n_trials) for path in PATHS]
    spawn = mp.get_context("spawn")
    barrier, results = spawn.Barrier(2), spawn.Queue()
    # both processes inherit the run's secret from the environment, as workers do
    os.environ.update(Security(RunCredentials.new(2), "plain").env())
    procs = [spawn.Process(target=receiver, args=(trials, n_msgs, nbytes, barrier, results)),
             spawn.Process(target=sender, args=(trials, n_msgs, nbytes, barrier))]
    for p in procs:
        p.start()
    rates: dict[str, list[float]] = {path: [] for path in PATHS}
    for _ in trials:
        path, rate = results.get(timeout=TIMEOUT_S)
        rates[path].append(rate)
    for p in procs:
        p.join(TIMEOUT_S)
    return rates


LABELS = {"raw": "raw pyzmq PUSH/PULL, copy=False",
          "open": "ZmqTransport, unauthenticated",
          "plain": "ZmqTransport, ZAP PLAIN (default)",
          "curve": "ZmqTransport, CURVE (encrypted)"}


def table(rates: dict[str, list[float]], mib: int, n_msgs: int) -> str:
    raw = statistics.median(rates["raw"])
    rows = [("path", "message", "median GB/s", "best GB/s", "median / raw", "trials (GB/s)")]
    for path in PATHS:
        median = statistics.median(rates[path])
        rows.append((LABELS[path], f"{mib} MiB x {n_msgs}", f"{median / 1e9:.2f}",
                     f"{max(rates[path]) / 1e9:.2f}", f"{median / raw:.3f}",
                     " ".join(f"{r / 1e9:.2f}" for r in rates[path])))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    ratio = statistics.median(rates[TARGET_PATH]) / raw
    verdict = "met" if ratio >= TARGET_RATIO else "MISSED"
    lines.append(f"target: {TARGET_PATH} / raw >= {TARGET_RATIO:.2f}: {ratio:.3f} ({verdict})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="message size in MiB")
    ap.add_argument("--messages", type=int, default=16, help="timed messages per trial")
    ap.add_argument("--trials", type=int, default=3, help="trials per path (alternating)")
    args = ap.parse_args()
    rates = run(args.mib, args.messages, args.trials)
    print(f"loopback TCP, 2 processes, pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), "
          f"torch {torch.__version__}")
    print(table(rates, args.mib, args.messages))


if __name__ == "__main__":
    main()
