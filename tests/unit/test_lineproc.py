"""The launcher's end of the packet line: control replies of any size within a deadline, and the
line's claim on the CPU (netem.lineproc), against a stand-in process on pipes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from netem import lineproc
from netem.lineproc import ControlPipe, PacketLineError, take_cpu

# a stand-in for the line: for each control line, the reply the test asked for (its size, and
# whether it stops halfway and keeps the pipe open)
STAND_IN = r"""
import json, sys, time
for raw in sys.stdin:
    msg = json.loads(raw)
    reply = json.dumps({"ok": True, "op": msg["op"], "pad": "x" * msg["size"]}) + "\n"
    if msg.get("stall"):
        sys.stdout.write(reply[: len(reply) // 2]); sys.stdout.flush(); time.sleep(30)
    sys.stdout.write(reply); sys.stdout.flush()
"""


@pytest.fixture
def stand_in():
    proc = subprocess.Popen([sys.executable, "-c", STAND_IN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_reply_four_times_a_pipes_buffer_is_read_whole_and_the_next_one_after_it(stand_in):
    pipe = ControlPipe(stand_in.stdin.fileno(), stand_in.stdout.fileno(), timeout_s=10.0)
    big = pipe.ask({"op": "stats", "size": 256 * 1024})
    assert len(big["pad"]) == 256 * 1024
    assert pipe.ask({"op": "set", "size": 3})["pad"] == "xxx"


def test_a_reply_that_stops_halfway_fails_at_the_deadline_naming_what_was_awaited(stand_in):
    pipe = ControlPipe(stand_in.stdin.fileno(), stand_in.stdout.fileno(), timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(PacketLineError, match=r"reply to 'stats' did not come within 0.5 s "
                                              r"\(\d+ bytes of it by then\)"):
        pipe.ask({"op": "stats", "size": 200_000, "stall": True})
    assert time.monotonic() - t0 < 3.0


def test_a_line_that_closed_its_output_is_said_so():
    r, w = os.pipe()
    r2, w2 = os.pipe()
    os.close(w2)                       # the line's stdout: closed before any reply
    try:
        with pytest.raises(PacketLineError, match="closed its output after 0 bytes"):
            ControlPipe(w, r2, timeout_s=2.0).ask({"op": "stats"})
    finally:
        for fd in (r, w, r2):
            os.close(fd)


def test_a_line_that_no_longer_reads_its_control_pipe_does_not_hang_the_writer():
    r, w = os.pipe()
    try:
        os.set_blocking(w, False)
        with pytest.raises(PacketLineError, match="did not take the control message 'set'"):
            ControlPipe(w, r, timeout_s=0.3).ask({"op": "set", "pad": "y" * (1 << 20)})
    finally:
        os.close(r)
        os.close(w)


def test_a_refusal_carries_the_lines_error():
    r, w = os.pipe()
    r2, w2 = os.pipe()
    os.write(w2, json.dumps({"ok": False, "error": "link (0, 0) is not a pair"}).encode()
             + b"\n")
    try:
        with pytest.raises(PacketLineError, match=r"refused .*link \(0, 0\) is not a pair"):
            ControlPipe(w, r2, timeout_s=2.0).ask({"op": "set"})
    finally:
        for fd in (r, w, r2, w2):
            os.close(fd)


def test_priority_none_and_nice_are_taken_as_asked():
    assert take_cpu(os.getpid(), "none")["got"] == "none"
    nice = take_cpu(os.getpid(), "nice")
    assert nice["got"] == "nice" and str(lineproc.WORKER_NICE) in nice["why"]


def test_realtime_where_refused_falls_back_to_nice_workers_under_auto_and_fails_when_asked(
        monkeypatch):
    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    got = take_cpu(os.getpid(), "auto")
    assert got["got"] == "nice" and "SCHED_FIFO refused (Operation not permitted)" in got["why"]
    with pytest.raises(PacketLineError, match="'realtime' is not possible here: SCHED_FIFO "
                                              "refused"):
        take_cpu(os.getpid(), "realtime")


def test_realtime_puts_every_thread_of_the_line_under_sched_fifo():
    """A child made real-time, read back from the kernel (sched_getscheduler); skipped where
    this process may not (not root, or inside a user namespace)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:
        try:
            got = take_cpu(child.pid, "realtime")
        except PacketLineError as exc:
            pytest.skip(str(exc))
        assert got["got"] == "realtime"
        assert os.sched_getscheduler(child.pid) == os.SCHED_FIFO
        assert os.sched_getparam(child.pid).sched_priority == lineproc.LINE_RT_PRIORITY
    finally:
        child.kill()
        child.wait()


def test_the_config_takes_the_lines_priorities():
    from gasloc_emu.config import setting_spec
    assert setting_spec("net.line_priority").meta["choices"] == lineproc.PRIORITIES
