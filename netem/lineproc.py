"""The packet delay line as a run's network session runs it: started in the switch namespace
once the ports exist, told about latency changes, asked for its counters, stopped before the
namespaces go.

The process (``python -m netem.packetline SPEC.json``, ``netem.packetline``) dies with its
parent (PR_SET_PDEATHSIG, and EOF on its stdin), so a kill -9 of the launcher leaves nothing
behind; ``close`` stops it on every other exit path and keeps its final counters.

The line gets the CPU before the workers (``take_cpu``): SCHED_FIFO where the kernel permits
it, else the workers start at a lower priority (``workers_niced``). On 2 cores shared with 8
training workers, a line at the same priority as they are released frames tens of ms late; what
each choice gives is in benchmarks/bench_packetline.py's table. Every wait on the line has a
deadline, and its error names what was waited for: a reply is read whole, however large.
"""
from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from typing import Any

from netem import rtkeeper
from netem.impair import impairment_of
from netem.packetline import spec_for_topology

# how the line gets the CPU before the workers (config's net.line_priority takes these)
PRIORITIES = ("auto", "realtime", "nice", "none")

# SCHED_FIFO priority of the line (chrt -f): above every SCHED_OTHER worker, below the kernel's
# own threads (1-99; 50 is what the kernel gives threaded interrupt handlers)
LINE_RT_PRIORITY = 10
# the workers' nice value where the line cannot be real-time: CFS then gives the line, at nice
# 0, 1024 / 110 of a worker's weight at nice 10 (kernel/sched/core.c sched_prio_to_weight),
# about 9 times as much of a contended core
WORKER_NICE = 10

READY_TIMEOUT_S = 20.0
REPLY_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0


class PacketLineError(RuntimeError):
    """The packet line did not start, stopped early, or refused a change; the message says why."""


def take_cpu(pid: int, asked: str) -> dict:
    """Give the line process the CPU before the workers, as ``asked`` (PRIORITIES): its record
    ``{"asked", "got", "why"}``, ``got`` being realtime, nice (the workers are to be started
    at WORKER_NICE) or none. SCHED_FIFO needs CAP_SYS_NICE in the initial user namespace (or
    an RLIMIT_RTPRIO), so inside the launcher's own user namespace it is refused; lowering
    other processes' priority is always allowed (sched(7))."""
    if asked == "none":
        return {"asked": asked, "got": "none", "why": "net.line_priority = 'none'"}
    if asked == "nice":
        return {"asked": asked, "got": "nice", "why": f"workers at nice {WORKER_NICE}"}
    try:
        rtkeeper.make_fifo(pid, LINE_RT_PRIORITY)
    except OSError as exc:
        why = f"SCHED_FIFO refused ({exc.strerror or exc})"
        try:
            rtkeeper.make_realtime(pid, LINE_RT_PRIORITY)
            return {"asked": asked, "got": "realtime",
                    "why": f"SCHED_FIFO priority {LINE_RT_PRIORITY}, set from outside the user "
                           "namespace"}
        except rtkeeper.KeeperError as kept:
            why += f"; {kept}"
        if asked == "realtime":
            raise PacketLineError(f"net.line_priority = 'realtime' is not possible here: "
                                  f"{why}; use 'auto' or 'nice'") from None
        return {"asked": asked, "got": "nice",
                "why": f"{why}; workers at nice {WORKER_NICE} instead"}
    return {"asked": asked, "got": "realtime",
            "why": f"SCHED_FIFO priority {LINE_RT_PRIORITY}"}


class ControlPipe:
    """The launcher's end of the line's control: JSON lines to its stdin, one JSON line back for
    each, in order. Every ask has a deadline (``timeout_s``, for the write and the whole reply
    together) and its error names what it waited for; a reply is read as it comes, so it may be
    far larger than a pipe's buffer."""

    def __init__(self, to_fd: int, from_fd: int, timeout_s: float = REPLY_TIMEOUT_S):
        self.to_fd, self.from_fd, self.timeout_s = to_fd, from_fd, timeout_s
        self._out = b""                  # reply bytes read past the last newline

    def ask(self, msg: dict) -> dict:
        """Send ``msg``; its reply, which must say ``ok``."""
        deadline = time.monotonic() + self.timeout_s
        what = f"{msg.get('op')!r}"
        self._write_all((json.dumps(msg) + "\n").encode(), deadline,
                        f"the packet line did not take the control message {what}")
        line = self._read_line(deadline, f"the packet line's reply to {what}")
        try:
            answer = json.loads(line)
        except ValueError:
            raise PacketLineError(f"the packet line's reply to {what} is not JSON: "
                                  f"{line[:200]!r}") from None
        if not isinstance(answer, dict) or not answer.get("ok"):
            error = answer.get("error") if isinstance(answer, dict) else answer
            raise PacketLineError(f"the packet line refused {msg}: {error}")
        return answer

    def _write_all(self, data: bytes, deadline: float, what: str) -> None:
        """All of ``data`` before ``deadline``: a line that stopped reading its control pipe
        must not hang the launcher."""
        os.set_blocking(self.to_fd, False)
        view = memoryview(data)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PacketLineError(f"{what} within {self.timeout_s:g} s")
            _, ready, _ = select.select([], [self.to_fd], [], left)
            if not ready:
                continue
            try:
                view = view[os.write(self.to_fd, view):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise PacketLineError(f"{what}: it closed its control pipe") from None

    def _read_line(self, deadline: float, what: str) -> bytes:
        """Bytes up to the next newline, read as they come; a PacketLineError naming ``what``
        past the deadline or when the other end closes first."""
        while b"\n" not in self._out:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PacketLineError(f"{what} did not come within {self.timeout_s:g} s "
                                      f"({len(self._out)} bytes of it by then)")
            ready, _, _ = select.select([self.from_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.from_fd, 1 << 20)
            if not chunk:
                raise PacketLineError(f"{what} did not come: the packet line closed its "
                                      f"output after {len(self._out)} bytes")
            self._out += chunk
        line, _, self._out = self._out.partition(b"\n")
        return line


class PacketLineProcess:
    """One run's packet line: ``start``, ``set_latency``, ``stats``, ``close``."""

    def __init__(self, plan, topo, seed: int = 0, priority: str = "auto"):
        if priority not in PRIORITIES:
            raise PacketLineError(f"line priority = {priority!r} is not allowed; expected one "
                                  f"of {', '.join(PRIORITIES)}")
        self.dir = tempfile.mkdtemp(prefix=f"gasloc-line-{topo.run_id}-")
        links = {key: impairment_of(link) for key, link in plan.links.items()}
        self.spec = spec_for_topology(topo, links, seed=seed,
                                      stats_path=os.path.join(self.dir, "stats.json"),
                                      ready_path=os.path.join(self.dir, "ready"))
        self.spec_path = os.path.join(self.dir, "spec.json")
        self.argv = ["ip", "netns", "exec", topo.switch_ns, sys.executable, "-m",
                     "netem.packetline", self.spec_path]
        self.proc: subprocess.Popen | None = None
        self.final: dict | None = None
        self.asked_priority = priority
        self.priority: dict = {"asked": priority, "got": "none", "why": "not started"}
        self.control: ControlPipe | None = None

    def start(self) -> None:
        from netem.packetline import die_with_parent
        self.spec.save(self.spec_path)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=die_with_parent)
        self.control = ControlPipe(self.proc.stdin.fileno(), self.proc.stdout.fileno())
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not os.path.exists(self.spec.ready_path):
            if self.proc.poll() is not None:
                raise PacketLineError(f"the packet line exited with {self.proc.returncode} "
                                      f"before it was ready: {self._stderr()}")
            if time.monotonic() > deadline:
                self.close()
                raise PacketLineError(f"the packet line was not ready within "
                                      f"{READY_TIMEOUT_S:g} s (waiting for its ready file "
                                      f"{self.spec.ready_path})")
            time.sleep(0.01)
        try:
            self.priority = take_cpu(self.proc.pid, self.asked_priority)
        except PacketLineError:
            self.close()
            raise

    @property
    def workers_niced(self) -> bool:
        """Whether the workers must run at a lower priority than the line (``WORKER_NICE``)."""
        return self.priority["got"] == "nice"

    def _stderr(self) -> str:
        with contextlib.suppress(Exception):
            return self.proc.stderr.read().decode(errors="replace").strip()[-500:]
        return ""

    def _ask(self, msg: dict) -> dict:
        """One control message and its reply (``ControlPipe.ask``)."""
        if self.proc is None or self.proc.poll() is not None:
            raise PacketLineError("the packet line is not running")
        return self.control.ask(msg)

    def set_latency(self, src: int, dst: int, latency_ms: float) -> None:
        self._ask({"op": "set", "src": src, "dst": dst, "delay_ms": latency_ms})

    def mark(self) -> None:
        """From now on the stats carry ``since_mark`` (the frames after this point alone)."""
        self._ask({"op": "mark"})

    def _ended(self) -> bool:
        """Whether the line has stopped (its final stats are all there is to read)."""
        return self.final is not None or self.proc is None or self.proc.poll() is not None

    def lateness(self) -> dict[str, Any] | None:
        """The line's release lateness and read lag alone (``{"op": "lateness"}``): cheap for
        the line to answer, which forwards nothing meanwhile; at its end, the final stats."""
        if self._ended():
            return self.final
        return self._ask({"op": "lateness"})["lateness"]

    def stats(self) -> dict[str, Any] | None:
        """The line's counters now (running) or at its end (closed)."""
        if self._ended():
            return self.final
        return self._ask({"op": "stats"})["stats"] | {"priority": self.priority}

    def close(self) -> None:
        """EOF on its stdin stops it (it writes its counters); killed if it does not."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError, ValueError), \
                open(self.spec.stats_path, encoding="utf-8") as f:
            self.final = json.load(f) | {"priority": self.priority}
        for f in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                f.close()
        self.proc = None
        for name in ("spec.json", "ready", "stats.json"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, name))
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)
