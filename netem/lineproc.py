"""The packet delay line as a run's network session runs it: started in the switch namespace
once the ports exist, told about latency changes, asked for its counters, stopped before the
namespaces go.

The process (``python -m netem.packetline SPEC.json``, ``netem.packetline``) dies with its
parent (PR_SET_PDEATHSIG, and EOF on its stdin), so a kill -9 of the launcher leaves nothing
behind; ``close`` stops it on every other exit path and keeps its final counters.
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

from netem.impair import impairment_of
from netem.packetline import spec_for_topology

READY_TIMEOUT_S = 20.0
REPLY_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0


class PacketLineError(RuntimeError):
    """The packet line did not start, stopped early, or refused a change; the message says why."""


class PacketLineProcess:
    """One run's packet line: ``start``, ``set_latency``, ``stats``, ``close``."""

    def __init__(self, plan, topo, seed: int = 0):
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

    def start(self) -> None:
        from netem.packetline import die_with_parent
        self.spec.save(self.spec_path)
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=die_with_parent)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not os.path.exists(self.spec.ready_path):
            if self.proc.poll() is not None:
                raise PacketLineError(f"the packet line exited with {self.proc.returncode} "
                                      f"before it was ready: {self._stderr()}")
            if time.monotonic() > deadline:
                self.close()
                raise PacketLineError(f"the packet line was not ready within "
                                      f"{READY_TIMEOUT_S:g} s")
            time.sleep(0.01)

    def _stderr(self) -> str:
        with contextlib.suppress(Exception):
            return self.proc.stderr.read().decode(errors="replace").strip()[-500:]
        return ""

    def _ask(self, msg: dict) -> dict:
        """One control message and its reply line (the line answers each in order)."""
        if self.proc is None or self.proc.poll() is not None:
            raise PacketLineError("the packet line is not running")
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], REPLY_TIMEOUT_S)
        if not ready:
            raise PacketLineError(f"the packet line did not answer {msg['op']!r} within "
                                  f"{REPLY_TIMEOUT_S:g} s")
        answer = json.loads(self.proc.stdout.readline() or b"{}")
        if not answer.get("ok"):
            raise PacketLineError(f"the packet line refused {msg}: {answer.get('error')}")
        return answer

    def set_latency(self, src: int, dst: int, latency_ms: float) -> None:
        self._ask({"op": "set", "src": src, "dst": dst, "delay_ms": latency_ms})

    def stats(self) -> dict[str, Any] | None:
        """The line's counters now (running) or at its end (closed)."""
        if self.final is not None or self.proc is None or self.proc.poll() is not None:
            return self.final
        return self._ask({"op": "stats"})["stats"]

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
            self.final = json.load(f)
        for f in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                f.close()
        self.proc = None
        for name in ("spec.json", "ready", "stats.json"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.dir, name))
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)
