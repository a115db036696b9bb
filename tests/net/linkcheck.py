"""One shaped link between two emulated hosts, measured: ``python linkcheck.py ROLE JSON``.

Run inside the hosts of ``hosts.py``, with the product's own pieces:

- ``tc-sink`` / ``tc-send``: the sender's host puts the run's tc (``netem.hosttc``: one HTB class
  for the link 0 -> 1, matched on host B's address and worker 1's port for sender 0) on the
  interface that routes to B, then streams bytes over plain TCP for ``seconds``; the sink
  prints the goodput it saw between its first and last byte.
- ``zmq-recv`` / ``zmq-send``: two ``ZmqTransport``s with the userspace shaper of the same link
  plan; the receiver prints the rate at which messages were released to it.

Prints ``MBIT <rate>`` (receiving side) and exits 0.
"""
from __future__ import annotations

import json
import socket
import sys
import time

from gasloc_emu.config import NetConfig
from netem.profiles import build_link_plan

CHUNK = 64 * 1024


def _plan(args: dict):
    return build_link_plan(NetConfig(bw_profile="uniform", rate_mbit=args["rate_mbit"]), 2, 0)


def tc_sink(args: dict) -> None:
    """Goodput from one second after the first byte to the last: what arrived before the sink
    first read (its socket buffer) would otherwise count as if it came in no time."""
    srv = socket.create_server((args["b"], args["port"]))
    srv.settimeout(60)
    conn, _ = srv.accept()
    total, start, last = 0, None, None
    while data := conn.recv(CHUNK):
        last = time.monotonic()
        if start is None:
            start = (last + 1.0, None)
        elif last >= start[0]:
            if start[1] is None:
                start = (last, total)  # the window opens after this read
            total += len(data)
    print(f"MBIT {(total - start[1]) * 8 / (last - start[0]) / 1e6:.4f}", flush=True)
    conn.close()


def tc_send(args: dict) -> None:
    from netem.hosttc import HostShaping, host_links, route_dev
    links = host_links(_plan(args), [0], {1: (args["b"], args["port"])}, route_dev)
    shaping = HostShaping("c0ffee", links, 1500)
    shaping.start()
    try:
        with _connect(args["b"], args["port"]) as s:
            end, buf = time.monotonic() + args["seconds"], b"\0" * CHUNK
            while time.monotonic() < end:
                s.sendall(buf)
            # what is still in the socket buffer must cross the shaper too: keep tc until
            # the sink has read everything and closed
            s.shutdown(socket.SHUT_WR)
            s.settimeout(120)
            s.recv(1)
    finally:
        shaping.close()


def leave_tc(args: dict) -> None:
    """Put the run's tc on and die without undoing it, like a run killed by SIGKILL."""
    import os

    from netem.hosttc import HostShaping, host_links, route_dev
    links = host_links(_plan(args), [0], {1: (args["b"], args["port"])}, route_dev)
    HostShaping("0dead", links, 1500).start()
    os._exit(9)


def _connect(host: str, port: int, within_s: float = 20.0) -> socket.socket:
    """A connection to the sink, which may start a moment after us."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=30)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _transport(args: dict, rank: int):
    from gasloc_emu.transport.zmq_transport import ZmqTransport
    from netem.capabilities import Decision
    from netem.userspace import shaping_from_spec, spec_for
    spec = spec_for(_plan(args), Decision("userspace", "release-queue", "test"))
    bind = f"tcp://{args['b'] if rank == 1 else args['a']}:{args['port'] + rank}"
    return ZmqTransport(rank, 2, bind, {1 - rank: f"tcp://{args['b']}:{args['port'] + 1}"},
                        max_numel=args["numel"], shaping=shaping_from_spec(spec, rank))


def zmq_recv(args: dict) -> None:
    tp = _transport(args, 1)
    times = []
    for r in range(args["messages"]):
        tp.recv(0, r, "z")
        times.append(time.time())
    nbytes = args["numel"] * 4 * (args["messages"] - 1)
    print(f"MBIT {nbytes * 8 / (times[-1] - times[0]) / 1e6:.4f}", flush=True)
    tp.close()


def zmq_send(args: dict) -> None:
    import torch
    tp = _transport(args, 0)
    for r in range(args["messages"]):
        tp.send(1, r, "z", torch.zeros(args["numel"]))
    time.sleep(args["messages"] * args["numel"] * 32 / (args["rate_mbit"] * 1e6) + 2)
    tp.close()


if __name__ == "__main__":
    {"tc-sink": tc_sink, "tc-send": tc_send, "leave-tc": leave_tc, "zmq-recv": zmq_recv,
     "zmq-send": zmq_send}[sys.argv[1]](json.loads(sys.argv[2]))
