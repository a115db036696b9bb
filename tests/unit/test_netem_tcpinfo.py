"""The kernel's account of a sender (netem.tcpinfo) on loopback: who held it back."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from netem import tcpinfo

WINDOW_S = 0.6


def _sender_shares(pause_s: float, read_pause_s: float) -> dict:
    """Send for WINDOW_S to a sink that pauses ``read_pause_s`` after each read, pausing
    ``pause_s`` after each write; the shares of the window."""
    srv = socket.create_server(("127.0.0.1", 0))

    def sink() -> None:
        conn, _ = srv.accept()
        while conn.recv(1 << 16):
            time.sleep(read_pause_s)
        conn.close()

    reader = threading.Thread(target=sink)
    reader.start()
    with socket.create_connection(srv.getsockname()) as sock:
        first = tcpinfo.read(sock)
        if first is None:
            pytest.skip("this kernel has no TCP_INFO chrono counters")
        end = time.monotonic() + WINDOW_S
        while time.monotonic() < end:
            sock.sendall(b"\0" * (1 << 14))
            time.sleep(pause_s)
        last = tcpinfo.read(sock)
    reader.join(timeout=30)
    srv.close()
    return tcpinfo.shares(first, last)


def test_a_sender_that_writes_little_is_idle():
    got = _sender_shares(pause_s=0.05, read_pause_s=0.0)
    assert got["idle"] > 0.8 and got["rwnd_limited"] == 0.0, got


def test_a_receiver_that_reads_slowly_limits_its_sender():
    got = _sender_shares(pause_s=0.0, read_pause_s=0.02)
    assert got["rwnd_limited"] > 0.5 and got["idle"] < 0.1, got


def test_shares_need_two_readings_in_order():
    a = tcpinfo.Chrono(1.0, 0, 0, 0, 0)
    b = tcpinfo.Chrono(2.0, 600_000, 100_000, 50_000, 3)
    assert tcpinfo.shares(a, b) == {"sending": 0.45, "rwnd_limited": 0.1,
                                    "sndbuf_limited": 0.05, "idle": 0.4, "retransmits": 3}
    assert tcpinfo.shares(None, b) is None and tcpinfo.shares(b, a) is None
