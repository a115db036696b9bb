"""The kernel's account of a sender (netem.tcpinfo) on loopback: who held it back; and the
host's steal time (netem.hoststat), which the probe's warnings name."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from netem import tcpinfo

WINDOW_S = 0.6


def _sender_shares(pause_s: float, read_pause_s: float) -> dict:
    """Send for WINDOW_S to a sink that pauses ``read_pause_s`` after each read, pausing
    ``pause_s`` after each write; the shares of the window, and the bytes written in it."""
    srv = socket.create_server(("127.0.0.1", 0))

    def sink() -> None:
        conn, _ = srv.accept()
        while conn.recv(1 << 16):
            time.sleep(read_pause_s)
        conn.close()

    reader = threading.Thread(target=sink)
    reader.start()
    written = 0
    with socket.create_connection(srv.getsockname()) as sock:
        first = tcpinfo.read(sock)
        if first is None:
            pytest.skip("this kernel has no TCP_INFO chrono counters")
        end = time.monotonic() + WINDOW_S
        while time.monotonic() < end:
            sock.sendall(b"\0" * (1 << 14))
            written += 1 << 14
            time.sleep(pause_s)
        time.sleep(0.05)  # loopback acknowledges within microseconds; the last write's too
        last = tcpinfo.read(sock)
    reader.join(timeout=30)
    srv.close()
    return tcpinfo.shares(first, last) | {"written_mbit": written * 8 / 1e6 /
                                          (last.at_s - first.at_s)}


def test_a_sender_that_writes_little_is_idle():
    got = _sender_shares(pause_s=0.05, read_pause_s=0.0)
    assert got["idle"] > 0.8 and got["rwnd_limited"] == 0.0, got


def test_a_receiver_that_reads_slowly_limits_its_sender():
    got = _sender_shares(pause_s=0.0, read_pause_s=0.02)
    assert got["rwnd_limited"] > 0.5 and got["idle"] < 0.1, got


def test_the_acknowledged_rate_is_what_the_sender_wrote_over_the_window():
    got = _sender_shares(pause_s=0.01, read_pause_s=0.0)  # 16 KiB every 10 ms at most
    assert got["acked_mbit"] == pytest.approx(got["written_mbit"], rel=1e-3), got


def test_shares_need_two_readings_in_order():
    a = tcpinfo.Chrono(1.0, 0, 0, 0, 0, 1_000)
    b = tcpinfo.Chrono(2.0, 600_000, 100_000, 50_000, 3, 2_501_000)
    assert tcpinfo.shares(a, b) == {"sending": 0.45, "rwnd_limited": 0.1,
                                    "sndbuf_limited": 0.05, "idle": 0.4, "retransmits": 3,
                                    "acked_mbit": 20.0}
    assert tcpinfo.shares(None, b) is None and tcpinfo.shares(b, a) is None


def test_the_host_steal_share_is_read_from_proc_stat_and_named_in_a_probe_warning(tmp_path):
    from gasloc_emu.emulator.launcher import _steal_note
    from netem import hoststat
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 0 0 10 40 0 0\ncpu0 1 2 3\n")
    before = hoststat.cpu_times(str(stat))
    stat.write_text("cpu  200 0 100 1000 0 0 10 190 0 0\n")
    shares = hoststat.cpu_shares(before, hoststat.cpu_times(str(stat)))
    assert shares["steal"] == 0.3 and shares["user"] == 0.2 and sum(shares.values()) == 1.0
    assert hoststat.cpu_times(str(tmp_path / "none")) is None
    assert "took 30% of this host's CPU time" in _steal_note({"host_steal": shares["steal"]})
    assert _steal_note({"host_steal": 0.01}) == "" and _steal_note({}) == ""


def test_a_run_that_lost_cpu_time_to_its_hypervisor_ends_with_a_warning():
    from gasloc_emu.report.fmt import summary_lines
    base = {"final_eval_loss": 2.5, "consensus_distance": 0.1, "wall_s": 10.0}
    stolen = summary_lines(base | {"host_cpu": {"steal": 0.17, "idle": 0.5}}, "runs/x")
    assert stolen[-1].startswith("warning: the hypervisor took 17% of this host's CPU time")
    assert len(summary_lines(base | {"host_cpu": {"steal": 0.01}}, "runs/x")) == 2
    assert len(summary_lines(base, "runs/x")) == 2
