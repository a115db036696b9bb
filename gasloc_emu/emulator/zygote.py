"""Workers forked from one process that has imported torch already: a start in a blink.

A worker process spends most of its start importing torch (about 2 s of a core here); with N
workers on a few cores that is N times over. The zygote is one process, started once by the
launcher (or a node agent), that imports what a worker needs and nothing runs: no torch
operation, no thread, no accelerator, no socket. Asked for a worker, it forks; the child takes
its own session, its log as stdout and stderr, the environment the launcher gave it (device,
the run's keys), and runs ``worker_process.main`` as ``python -m`` would have.

The zygote reaps its children and tells the launcher their exit codes; ``Forked`` is the
launcher's handle on one, with the part of ``subprocess.Popen`` the launcher uses (pid, poll,
wait; ``processes.kill_group`` kills its session). A worker that lives in its own network
namespace (tc shaping on one host) enters it after the fork, as ``ip netns exec`` would have.

The run plan travels the same way: the launcher hands the zygote the plan it built
(``plan.handed``: serialised, base64 in one line), the zygote keeps the bytes without reading
them, and every worker forked after that reads them back (``plan.received``) instead of
deriving the plan from the config again.

Protocol (JSON lines, one request in flight at a time): launcher -> zygote {"plan"} once,
answered {"planned": bytes}, then {"argv", "env", "log", "append", "netns", "nice"} per worker,
answered {"pid"}; zygote -> launcher {"exit": pid, "code"} when a worker ends (a negative
code: killed by that signal, as Popen reports it).
"""
from __future__ import annotations

import base64
import json
import os
import select
import subprocess
import sys
import threading
import time
import traceback

_POLL_S = 0.2   # how often the zygote looks for children that ended while no request came


class ZygoteError(RuntimeError):
    """The zygote could not fork a worker, or is gone."""


class Forked:
    """A worker the zygote forked, as the launcher sees it (a ``subprocess.Popen`` subset)."""

    def __init__(self, zygote: Zygote, pid: int):
        self.zygote, self.pid = zygote, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        code = self.zygote.wait_exit(self.pid, deadline)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout)
        self.returncode = code
        return code


class Zygote:
    """The launcher's side: start the zygote (``start``, or at the first ``spawn``), ask it
    for workers, collect their exits."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.cond = threading.Condition()
        self.pids: list[int] = []
        self.exits: dict[int, int] = {}
        self.alive = False
        self.planned = False   # the zygote has the run plan (``hand_plan``)

    def start(self) -> Zygote:
        """Start the zygote now, so that it imports while the caller does something else.
        Call it from the thread that lives as long as the run: the zygote dies with it."""
        if self.proc is None:
            self.proc = subprocess.Popen([sys.executable, "-m", "gasloc_emu.emulator.zygote"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         start_new_session=True, text=True, bufsize=1)
            self.alive = True
            threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()
        return self

    def __enter__(self) -> Zygote:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def hand_plan(self, blob: bytes) -> None:
        """Give the zygote the run plan (``plan.handed``) for every worker it forks from now."""
        self.start()
        with self.cond:
            if not self.alive:
                raise ZygoteError("the worker zygote has exited")
            self.proc.stdin.write(json.dumps({"plan": base64.b64encode(blob).decode()}) + "\n")
            self.proc.stdin.flush()
            # one request in flight at a time: the zygote reads its pipe a line per select()
            if not self.cond.wait_for(lambda: self.planned or not self.alive, timeout=30):
                raise ZygoteError("the worker zygote did not take the run plan within 30 s")
            if not self.planned:
                raise ZygoteError("the worker zygote exited instead of taking the run plan")

    def spawn(self, argv: list[str], env: dict[str, str], log: str, append: bool,
              netns: str | None = None, nice: int = 0) -> Forked:
        """Fork a worker running ``python -m gasloc_emu.emulator.worker_process ARGV``, in the
        named network namespace ``netns`` (``ip netns``) when given, ``nice`` steps below the
        zygote's priority."""
        request = {"argv": argv, "env": env, "log": log, "append": append, "netns": netns,
                   "nice": nice}
        self.start()
        with self.cond:
            if not self.alive:
                raise ZygoteError("the worker zygote has exited")
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            if not self.cond.wait_for(lambda: self.pids or not self.alive, timeout=30):
                raise ZygoteError("the worker zygote did not fork within 30 s")
            if not self.pids:
                raise ZygoteError("the worker zygote exited instead of forking")
            return Forked(self, self.pids.pop(0))

    def exit_code(self, pid: int) -> int | None:
        with self.cond:
            return self.exits.get(pid)

    def wait_exit(self, pid: int, deadline: float | None) -> int | None:
        """``pid``'s exit code once the zygote reports it; None at ``deadline``, or at once
        when the zygote is gone (it will report nothing more)."""
        with self.cond:
            def ended() -> bool:
                return pid in self.exits or not self.alive

            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self.cond.wait_for(ended, timeout=left)
            return self.exits.get(pid)

    def close(self) -> None:
        """No more workers: the zygote exits once its children have (it must outlive them,
        or the kernel would kill them with it)."""
        if self.proc is not None and self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self.cond:
                if "exit" in msg:
                    self.exits[msg["exit"]] = msg["code"]
                elif "planned" in msg:
                    self.planned = True
                else:
                    self.pids.append(msg["pid"])
                self.cond.notify_all()
        with self.cond:
            self.alive = False
            self.cond.notify_all()


# ---------------------------------------------------------------- the zygote process

def _preload() -> None:
    """Import what every worker imports, so that a forked one starts with it loaded; torch's
    compiler included (about 1.5 s of a core: the first optimizer step imports it)."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import zmq  # noqa: F401

    import gasloc_emu.emulator.worker_process  # noqa: F401
    import gasloc_emu.plan  # noqa: F401
    import gasloc_emu.training.worker  # noqa: F401
    import gasloc_emu.transport.zmq_transport  # noqa: F401


def _child(request: dict, plan: bytes | None) -> None:
    """In the forked child: become the worker the request describes, with the launcher's
    ``plan``; never returns."""
    code = 1
    try:
        os.setsid()   # its own session: Ctrl-C reaches only the launcher
        if request.get("netns"):
            _enter_netns(request["netns"])
        if request.get("nice"):
            os.nice(int(request["nice"]))     # lowering one's own priority is always allowed
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT
                     | (os.O_APPEND if request["append"] else os.O_TRUNC), 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update(request["env"])
        from gasloc_emu.emulator import worker_process
        sys.argv = ["gasloc_emu.emulator.worker_process", *request["argv"]]
        code = worker_process.main(request["argv"], plan)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the worker's log says why, the exit code that it did
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


_CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"   # where ``ip netns add`` pins a named namespace


def _enter_netns(name: str) -> None:
    """Move this (single-threaded, just forked) process into the named network namespace, as
    ``ip netns exec`` would; its sockets are then that namespace's."""
    import ctypes
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name!r}: {os.strerror(err)}")
    finally:
        os.close(fd)


def _reap(out, live: set[int]) -> None:
    """Tell the launcher about every child that ended since the last look."""
    while live:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        live.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        out.write(json.dumps({"exit": pid, "code": code}) + "\n")
        out.flush()


def main() -> int:
    from gasloc_emu.emulator.worker_process import die_with_parent
    die_with_parent()
    _preload()
    inp, out = sys.stdin, sys.stdout
    live: set[int] = set()
    plan: bytes | None = None   # kept as bytes: the zygote runs nothing of the run
    open_input = True
    while open_input or live:   # it outlives its children: they die with it
        if open_input and select.select([inp], [], [], _POLL_S)[0]:
            line = inp.readline()
            if not line:
                open_input = False
            elif "plan" in (request := json.loads(line)):
                plan = base64.b64decode(request["plan"])
                out.write(json.dumps({"planned": len(plan)}) + "\n")
                out.flush()
            else:
                live.add(_fork(request, out, plan))
        elif not open_input:
            time.sleep(_POLL_S)
        _reap(out, live)
    return 0


def _fork(request: dict, out, plan: bytes | None) -> int:
    pid = os.fork()
    if pid == 0:
        _child(request, plan)
    out.write(json.dumps({"pid": pid}) + "\n")
    out.flush()
    return pid


if __name__ == "__main__":
    sys.exit(main())
