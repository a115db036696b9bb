"""Worker processes as the operating system sees them: spawn one (its own process group, its
environment pinning a device and carrying the run's secret), reap and kill them, and remove the
ipc:// socket files a run leaves behind.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from gasloc_emu.emulator.zygote import Forked, Zygote
from gasloc_emu.training.devices import DeviceAssignment
from gasloc_emu.transport import auth


def spawn_worker(run_dir: Path, rank: int, device: DeviceAssignment, network,
                 security: auth.Security, rejoin: tuple[str, int] | None = None,
                 zygote: Zygote | None = None) -> subprocess.Popen | Forked:
    """Start worker ``rank`` (``python -m gasloc_emu.emulator.worker_process DIR RANK``) with its
    device pinned and the run's keys in its environment only; its output goes to
    ``workers/worker<rank>.log`` (appended to by a successor: ``rejoin`` = (the address it
    binds, the round it joins at)). With a ``zygote``, forked from it (into the worker's
    network namespace where it has one), else started afresh."""
    logs = Path(run_dir) / "workers"
    logs.mkdir(exist_ok=True)
    args = [str(run_dir), str(rank), *([rejoin[0], str(rejoin[1])] if rejoin else [])]
    plain = [sys.executable, "-m", "gasloc_emu.emulator.worker_process", *args]
    argv = network.wrap(rank, plain)
    env = os.environ | device.env | {"PYTHONUNBUFFERED": "1"} | security.env()
    log_path = logs / f"worker{rank}.log"
    if zygote is not None:
        return zygote.spawn(args, dict(env), str(log_path), append=rejoin is not None,
                            netns=network.netns(rank), nice=network.worker_nice)
    with open(log_path, "ab" if rejoin else "wb") as log:
        # own session: Ctrl-C reaches only the launcher, which stops the workers cleanly
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def reap(procs: list[subprocess.Popen | Forked], grace_s: float) -> None:
    """Wait up to ``grace_s`` for every process to exit, then kill what is left."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_group(proc)


def worker_identity(rank: int) -> bytes:
    """The ROUTER identity of worker ``rank``'s DEALER (``control.WorkerControl``)."""
    return auth.user_id(rank).encode()


def remove_socket_files(addrs) -> None:
    """Remove the ipc:// socket files of a run, and their folder when it is a temporary one
    (``control.ctl_paths`` puts long run paths' sockets under /tmp/gasloc-<pid>-<hash>)."""
    for addr in addrs:
        path = Path(addr.removeprefix("ipc://"))
        path.unlink(missing_ok=True)
        if path.parent.name.startswith("gasloc-") and path.parent.parent == Path("/tmp"):
            shutil.rmtree(path.parent, ignore_errors=True)


def remove_stale_socket_dirs(tmp: Path = Path("/tmp")) -> list[Path]:
    """Socket folders left by launchers that were killed (their pid is gone); returns them."""
    stale = []
    for d in tmp.glob("gasloc-*-*"):
        pid = d.name.split("-")[1]
        if d.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
            stale.append(d)
    return stale


def kill_group(proc: subprocess.Popen | Forked) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@dataclass
class WorkerSlot:
    rank: int
    proc: subprocess.Popen | Forked
    device: DeviceAssignment
    last_seen: float
    round: int = -1
    ready: dict | None = None
    final: dict | None = None
    theta: object = None
    status: dict = field(default_factory=dict)
    overruns: int = 0  # paced inner steps that took longer than their nominal time
    gone: bool = False  # left for good, as its scenario says: no final, no supervision
    # the counters of this rank's earlier processes, each sent as it left (``Departed``)
    departed: list = field(default_factory=list)
    departures: int = 0   # its processes that left as the scenario says (each sends Departed)
    # this process's last checked heartbeat (``control.Heartbeat``), and the messages its rows
    # say it did without (``dead_peer``): what is known of its counters if it is killed
    heartbeat: object = None
    rows_dead_peer: int = 0
    killed: list = field(default_factory=list)   # what is known of each (``killed_counters``)
