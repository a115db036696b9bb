"""Real-time priority for the packet line, from outside the launcher's user namespace.

The launcher re-executes itself inside its own user namespace (``reexec_in_userns``), where
SCHED_FIFO is refused even to root: sched_setscheduler(2) needs CAP_SYS_NICE in the initial user
namespace (kernel/sched/core.c, __sched_setscheduler -> capable(CAP_SYS_NICE)). So before the
exec, where the process still has the host's capabilities, it forks a keeper that stays
outside. The keeper takes one request a line on a pipe, a process id, and makes every thread of
that process SCHED_FIFO at the asked priority, answering ``ok`` or the reason it did not.

Nothing on the pipe is trusted: a request must be a decimal pid of a live process that
descends from the launcher (its parent chain in /proc reaches the keeper's parent), and a
priority in [1, 99]; anything else is refused with a reason. The keeper dies with the launcher
(PR_SET_PDEATHSIG and EOF on the pipe), and holds nothing else.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import time

ENV_FDS = "GASLOC_EMU_RT_FDS"     # "request fd,reply fd" of the launcher's end
ASK_TIMEOUT_S = 2.0
MAX_REQUEST_BYTES = 64
PARENT_WALK = 16                  # how far up /proc's parent chain a target may be
PR_SET_PDEATHSIG = 1


class KeeperError(RuntimeError):
    """The keeper is not there, did not answer in time, or refused; the message says which."""


# ---------------------------------------------------------------- the keeper's rules (pure)

def parse_request(raw: bytes) -> tuple[int, int]:
    """``b"PID PRIORITY"`` as two integers; a ValueError naming the bad value otherwise."""
    parts = raw.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"request {raw[:MAX_REQUEST_BYTES]!r} is not 'PID PRIORITY'")
    pid, priority = int(parts[0]), int(parts[1])
    if not 1 <= pid <= 4_194_304:                  # PID_MAX_LIMIT
        raise ValueError(f"pid = {pid} is out of range; expected [1, 4194304]")
    if not 1 <= priority <= 99:
        raise ValueError(f"priority = {priority} is out of range; expected [1, 99]")
    return pid, priority


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` from /proc/PID/stat, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descends_from(pid: int, ancestor: int, parent=parent_of) -> bool:
    """Whether ``ancestor`` is on ``pid``'s parent chain (within PARENT_WALK steps)."""
    for _ in range(PARENT_WALK):
        up = parent(pid)
        if up is None or up <= 1:
            return False
        if up == ancestor:
            return True
        pid = up
    return False


# ---------------------------------------------------------------- the keeper process

def make_fifo(pid: int, priority: int) -> None:
    """Every thread of ``pid`` SCHED_FIFO at ``priority`` (a scheduling policy is per thread);
    a ProcessLookupError when ``pid`` is gone, the kernel's OSError when it refuses."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        raise ProcessLookupError(f"pid {pid} is gone") from None
    for tid in tids:
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))


def _answer(raw: bytes, launcher: int) -> str:
    try:
        pid, priority = parse_request(raw)
    except ValueError as exc:
        return f"refused: {exc}"
    if not descends_from(pid, launcher):
        return f"refused: pid {pid} is not a process of the launcher {launcher}"
    try:
        make_fifo(pid, priority)
    except ProcessLookupError:
        return f"refused: pid {pid} is gone"
    except OSError as exc:
        return f"refused: SCHED_FIFO outside the user namespace: {exc.strerror or exc}"
    return "ok"


def _serve(req_r: int, rep_w: int, launcher: int) -> None:
    tail = b""
    while True:
        chunk = os.read(req_r, 4096)
        if not chunk:
            return
        *lines, tail = (tail + chunk).split(b"\n")
        if len(tail) > MAX_REQUEST_BYTES:
            tail = b""
            os.write(rep_w, b"refused: request too long\n")
        for raw in lines:
            os.write(rep_w, (_answer(raw, launcher) + "\n").encode())


def start() -> dict[str, str]:
    """Fork the keeper (call before the exec into the user namespace, before any thread);
    the environment that tells the re-executed launcher where to reach it."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:                                   # the keeper
        code = 0
        try:
            os.close(req_w)
            os.close(rep_r)
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL,
                                                        0, 0, 0)
            if os.getppid() != launcher:           # the launcher died before the prctl
                os._exit(0)
            _serve(req_r, rep_w, launcher)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(req_r)
    os.close(rep_w)
    os.set_inheritable(req_w, True)
    os.set_inheritable(rep_r, True)
    return {ENV_FDS: f"{req_w},{rep_r}"}


# ---------------------------------------------------------------- the launcher's end

_channel: tuple[int, int] | None = None
_taken = False


def channel() -> tuple[int, int] | None:
    """The keeper's pipe ends, taken from the environment once (and removed from it, and made
    non-inheritable, so that no worker gets them); None without a keeper."""
    global _channel, _taken
    if not _taken:
        _taken = True
        value = os.environ.pop(ENV_FDS, "")
        with contextlib.suppress(ValueError, OSError):
            req_w, rep_r = (int(v) for v in value.split(","))
            for fd in (req_w, rep_r):
                os.set_inheritable(fd, False)
            _channel = (req_w, rep_r)
    return _channel


def make_realtime(pid: int, priority: int) -> None:
    """Ask the keeper to make ``pid`` SCHED_FIFO at ``priority``; a KeeperError says why not."""
    ends = channel()
    if ends is None:
        raise KeeperError("no keeper outside the user namespace")
    req_w, rep_r = ends
    try:
        os.write(req_w, f"{pid} {priority}\n".encode())
    except OSError as exc:
        raise KeeperError(f"the keeper is gone ({exc.strerror or exc})") from None
    deadline, got = time.monotonic() + ASK_TIMEOUT_S, b""
    while not got.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([rep_r], [], [], left)[0]:
            raise KeeperError(f"the keeper did not answer within {ASK_TIMEOUT_S:g} s")
        chunk = os.read(rep_r, 4096)
        if not chunk:
            raise KeeperError("the keeper is gone")
        got += chunk
    answer = got.decode(errors="replace").strip()
    if answer != "ok":
        raise KeeperError(f"the keeper {answer}")
