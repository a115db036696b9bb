"""Build and tear down a run's network, and the user namespace it lives in.

How the launcher uses this (tc shaper):

1. Early in ``main``, before any thread exists: ``reexec_in_userns(sys.argv[1:])``. It execs
   ``unshare -Urnm -- <python> -m gasloc_emu ARGS`` with ``GASLOC_EMU_IN_USERNS=1`` when not
   yet inside; the process keeps its pid and is "root" in a new user, network and mount
   namespace. Every namespace, veth, bridge and qdisc it creates belongs to it and disappears
   when it exits, even on kill -9 (once its workers, which die with it by PR_SET_PDEATHSIG, are
   gone). It returns False where user namespaces are disabled: then real root builds the same
   topology in the host's namespace under run-prefixed names (``gl<run>-...``), which
   ``clean_leftovers`` removes after a kill -9; without root the userspace shaper is used.
2. ``with NetworkSession(plan, decision, run_id) as session:`` builds everything (inside the user
   namespace it first mounts a private tmpfs for ``ip netns``: ``prepare_userns``), and undoes it
   on exit, also on exceptions.
3. Start worker k with ``session.wrap(k, argv)`` (``ip netns exec gl<run>-w<k> argv``: the same pid
   runs argv inside the namespace), bind it to ``session.bind_address(k)``, give it
   ``session.shaping_spec()`` (``netem.userspace.shaping_from_spec``).
"""
from __future__ import annotations

import ctypes
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

from netem import rtkeeper, tcpsettings
from netem.capabilities import CapabilityError, Decision, in_user_namespace, userns_works
from netem.commands import (
    NETNS_RE,
    Command,
    NetTopology,
    check_supported,
    plan_commands,
    teardown_commands,
)
from netem.lineproc import WORKER_NICE
from netem.profiles import LinkPlan
from netem.tcpsettings import TcpSettings
from netem.userspace import shaping_from_spec, spec_for

ENV_FLAG = "GASLOC_EMU_IN_USERNS"
BASE_PORT = 29500           # data-plane port of worker k inside the namespaces: BASE_PORT + k
COMMAND_TIMEOUT_S = 60.0
_PR_SET_PDEATHSIG = 1
_prepared = False


class NamespaceError(RuntimeError):
    """Building or removing the emulated network failed; the message names the command."""


# ---------------------------------------------------------------- running commands

def _batch_key(cmd: Command) -> tuple[str, str | None] | None:
    """ip/tc commands in one namespace can share one ``-batch`` process (ip netns ... cannot)."""
    if cmd.tool == "tc" or (cmd.tool == "ip" and cmd.argv[1:2] != ("netns",)):
        return cmd.tool, cmd.netns
    return None


def _batches(cmds: list[Command]) -> list[list[Command]]:
    out: list[list[Command]] = []
    for cmd in cmds:
        key = _batch_key(cmd)
        if out and key is not None and _batch_key(out[-1][0]) == key:
            out[-1].append(cmd)
        else:
            out.append([cmd])
    return out


def _failed_line(stderr: str) -> int | None:
    """tc/ip -batch report "Command failed -:N" (N counts from 1)."""
    m = re.search(r"Command failed -:(\d+)", stderr)
    return int(m.group(1)) if m else None


def _run_batch(batch: list[Command]) -> None:
    if len(batch) == 1:
        argv, script = batch[0].full_argv(), None
    else:
        argv = Command(batch[0].argv[:1] + ("-batch", "-"), batch[0].netns).full_argv()
        script = "".join(" ".join(c.argv[1:]) + "\n" for c in batch)
    try:
        proc = subprocess.run(argv, input=script, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NamespaceError(f"{batch[0]}: {exc}") from None
    if proc.returncode != 0:
        line = _failed_line(proc.stderr) or 1
        failed = batch[min(line, len(batch)) - 1]
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise NamespaceError(f"`{failed}` failed: {msg[0] if msg else f'exit {proc.returncode}'}")


def run_commands(cmds: list[Command], done: Callable[[Command], None] | None = None) -> None:
    """Run ``cmds`` in order (batched per namespace); ``done`` sees each batch that succeeded.

    Namespace adds are never batched, so after a failure ``done`` has seen every namespace
    that exists, which is all that teardown needs.
    """
    for batch in _batches(cmds):
        _run_batch(batch)
        for cmd in batch:
            if done:
                done(cmd)


# ---------------------------------------------------------------- the user namespace

def reexec_argv(argv: list[str], entry: list[str] | None = None) -> list[str]:
    """The command that re-runs this program inside a new user + network + mount namespace."""
    return ["unshare", "-Urnm", "--", *(entry or [sys.executable, "-m", "gasloc_emu"]), *argv]


def inside_userns(env_flag: str = ENV_FLAG) -> bool:
    """Whether this process was re-executed by ``reexec_in_userns`` (flag set and a user
    namespace)."""
    return os.environ.get(env_flag) == "1" and in_user_namespace()


def reexec_in_userns(argv: list[str], env_flag: str = ENV_FLAG,
                     entry: list[str] | None = None) -> bool:
    """Exec this program again inside its own user namespace, unless already there.

    Returns True when already inside, False when user namespaces do not work here (the caller
    falls back to root mode or the userspace shaper); otherwise it does not return. Call it
    before starting any thread. ``entry`` replaces ``[python, -m, gasloc_emu.commands.cli]``.
    """
    if inside_userns(env_flag):
        return True
    if not userns_works():
        return False
    sys.stdout.flush()
    sys.stderr.flush()
    # SCHED_FIFO for the packet line is refused inside the namespace: a keeper outside gives it
    env = dict(os.environ, **{env_flag: "1"}, **tcpsettings.host_snapshot_env(),
               **rtkeeper.start())
    cmd = reexec_argv(argv, entry)
    os.execvpe(cmd[0], cmd, env)
    raise AssertionError("unreachable: execvpe returned")


def prepare_userns(env_flag: str = ENV_FLAG) -> None:
    """Inside the re-executed process: a private tmpfs for ``ip netns`` and loopback up (once).

    The mount lives in our own mount namespace, so the host's /run is untouched; mounting on
    /run/netns where it exists keeps the rest of /run (sockets, XDG_RUNTIME_DIR) visible.
    """
    global _prepared
    if _prepared:
        return
    if not inside_userns(env_flag):
        raise NamespaceError("prepare_userns() only runs inside the namespace made by "
                             "reexec_in_userns(); refusing to mount over the host's /run")
    target = "/run/netns" if os.path.isdir("/run/netns") else "/run"
    run_commands([Command(("mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "gasloc-netns",
                           target)),
                  Command(("mkdir", "-p", "/run/netns")),
                  Command(("ip", "link", "set", "lo", "up"))])
    _prepared = True


_IMPORTER_PID = os.getpid()   # read in a forked child, this is still the parent's pid


def die_with_parent() -> None:
    """preexec_fn for children we start: SIGKILL them when our process dies, even by kill -9."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != _IMPORTER_PID:   # the parent died before prctl took effect
        os._exit(1)


def new_run_id() -> str:
    """Six hex digits: short enough for names, enough to keep concurrent root-mode runs apart."""
    return secrets.token_hex(3)


# ---------------------------------------------------------------- leftovers (root mode)

def _host_netns() -> list[str]:
    proc = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _netns_pids(name: str) -> list[int]:
    proc = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT_S)
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def leftover_commands(names: list[str], pids: dict[str, list[int]]) -> list[Command]:
    """Pure: kill what still runs inside each namespace, then remove it (its links and qdiscs go
    with it)."""
    out = []
    for name in names:
        out += [Command(("kill", "-KILL", str(p)), None, f"process {p} left in {name}")
                for p in pids.get(name, [])]
        out.append(Command(("ip", "netns", "del", name), None, f"leftover namespace {name}"))
    return out


def clean_leftovers(run_id: str | None = None, dry_run: bool = False,
                    echo: Callable[[str], None] = print) -> list[str]:
    """Remove the host-level leftovers of killed root-mode runs (all runs, or one ``run_id``).

    Only namespaces named like ours (``gl<hex>-sw``, ``gl<hex>-w<k>``) are touched. Our veths,
    bridge and ifb devices never live in the host namespace (they are created directly inside
    the run's namespaces), so removing the namespaces removes them and their qdiscs.
    Returns (and echoes) the commands it ran.
    """
    names = [n for n in _host_netns() if (m := NETNS_RE.match(n)) and run_id in (None, m.group(1))]
    cmds = leftover_commands(names, {n: _netns_pids(n) for n in names})
    for cmd in cmds:
        echo(str(cmd))
        if not dry_run:
            subprocess.run(cmd.full_argv(), capture_output=True, timeout=COMMAND_TIMEOUT_S)
    return [str(c) for c in cmds]


# ---------------------------------------------------------------- the session

def _free_loopback_ports(count: int) -> list[int]:
    """Ports the kernel hands out as free right now (held together so they are distinct)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class NetworkSession:
    """The emulated network of one run: built on ``__enter__``, removed on ``__exit__``.

    ``mode`` is 'userns' (tc inside our own user namespace), 'root' (tc in the host's
    namespace under run-prefixed names) or 'loopback' (userspace shaper or no shaping: every
    worker on 127.0.0.1). With ``dry_run`` nothing is run; ``dry_run_text`` lists the commands.
    """

    def __init__(self, plan: LinkPlan, decision: Decision, run_id: str | None = None,
                 dry_run: bool = False, env_flag: str = ENV_FLAG,
                 gso_floor_mbit: dict[int, float] | None = None, seed: int = 0,
                 delayed_later: bool = False, line_priority: str = "auto"):
        self.plan, self.decision, self.dry_run, self.env_flag = plan, decision, dry_run, env_flag
        self.line_priority = line_priority  # netem.lineproc.PRIORITIES
        self.seed = seed            # of the packet line's draws (jitter, loss), per link
        # per worker, the slowest rate a scenario will give its links (plan_commands, LiveLinks)
        self.gso_floor_mbit = gso_floor_mbit or {}
        self.run_id = run_id or new_run_id()
        self.mode = self._choose_mode()
        self.topo = (NetTopology(self.run_id, plan.workers, plan.mtu)
                     if self.mode != "loopback" else None)
        # both validate what the shaper cannot do, before anything exists
        # the packet line runs when a link is impaired now or a scenario delays one later
        self.runs_line = (self.topo is not None
                          and decision.delay_mode.replaces_bridge(plan, delayed_later))
        self.commands = (plan_commands(plan, self.topo, decision,
                                       gso_floor_mbit=self.gso_floor_mbit,
                                       delayed_later=delayed_later) if self.topo else [])
        check_supported(plan, decision)
        self.spec = spec_for(plan, decision)
        self.ports = [BASE_PORT + k for k in range(plan.workers)] if self.topo else \
            _free_loopback_ports(plan.workers)
        self.executed: list[Command] = []
        self.removed: list[str] = []
        self.line = None            # netem.lineproc.PacketLineProcess, when the line delays
        self.line_stats: dict | None = None

    def _choose_mode(self) -> str:
        if not self.decision.shaper_kind.worker_namespaces:
            return "loopback"
        if inside_userns(self.env_flag) or (self.dry_run and userns_works()):
            return "userns"     # a real run re-executes itself into its own user namespace
        if os.geteuid() == 0:
            return "root"
        if self.dry_run:
            return "userns"
        raise CapabilityError("the tc shaper needs this process inside a user namespace "
                              "(call netem.namespaces.reexec_in_userns first) or root")

    # -- what the launcher asks

    def address(self, rank: int) -> str:
        return self.topo.address(rank) if self.topo else "127.0.0.1"

    def port(self, rank: int) -> int:
        return self.ports[rank]

    def bind_address(self, rank: int) -> str:
        return f"tcp://{self.address(rank)}:{self.port(rank)}"

    def netns(self, rank: int) -> str | None:
        return self.topo.worker_ns(rank) if self.topo else None

    def wrap(self, rank: int, argv: list[str]) -> list[str]:
        """argv that runs ``argv`` inside worker ``rank``'s namespace (same pid: ip netns exec
        execs)."""
        ns = self.netns(rank)
        if self.worker_nice:
            argv = ["nice", "-n", str(self.worker_nice), *argv]
        return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)

    @property
    def worker_nice(self) -> int:
        """How far below normal priority the workers start: WORKER_NICE where the packet line
        could not be made real-time (they yield it the CPU instead), else 0."""
        return WORKER_NICE if self.line is not None and self.line.workers_niced else 0

    def shaping_spec(self) -> dict | None:
        """JSON-able spec of the userspace shaping for all workers (``shaping_from_spec``), or
        None."""
        return self.spec

    def shaping(self, rank: int):
        """Worker ``rank``'s ``LinkShaper`` (userspace pacing / release queue), or None."""
        return shaping_from_spec(self.spec, rank)

    # -- lifecycle

    def __enter__(self) -> NetworkSession:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(raise_errors=exc_type is None)

    def start(self) -> None:
        if self.dry_run:
            return
        if inside_userns(self.env_flag):
            # also for loopback modes: a new netns starts with lo down
            prepare_userns(self.env_flag)
        if not self.commands:
            return
        try:
            run_commands(self.commands, done=self.executed.append)
            if self.runs_line:
                self._start_line()
        except BaseException:
            self.close(raise_errors=False)
            raise

    def _start_line(self) -> None:
        from netem.lineproc import PacketLineProcess
        self.line = PacketLineProcess(self.plan, self.topo, self.seed, self.line_priority)
        self.line.start()

    def set_line_latency(self, src: int, dst: int, latency_ms: float) -> None:
        """A link's new one-way latency, for the packet line (its other impairments stay)."""
        if self.line is None:
            raise NamespaceError("no packet line runs in this session to change a latency of")
        self.line.set_latency(src, dst, latency_ms)

    def packet_line_stats(self) -> dict | None:
        """The packet line's counters (per link: forwarded, lost, queue drops; release
        lateness), now or as it ended; None without a line."""
        if self.line is not None:
            return self.line.stats()
        return self.line_stats

    def packet_line_lateness(self) -> dict | None:
        """The packet line's release lateness and read lag alone (no link counters), now or
        as it ended; None without a line."""
        if self.line is not None:
            return self.line.lateness()
        return self.line_stats

    def _created_namespaces(self) -> list[str]:
        return [c.argv[3] for c in self.executed if c.argv[:3] == ("ip", "netns", "add")]

    def close(self, raise_errors: bool = True) -> None:
        """Stop the packet line, kill what still runs in our namespaces, then delete them
        (veths, qdiscs go with them)."""
        if self.line is not None:
            self.line.close()
            self.line_stats, self.line = self.line.final, None
        created = set(self._created_namespaces())
        if not created:
            return
        cmds = [c for c in teardown_commands(self.topo) if c.argv[3] in created]
        pids = {c.argv[3]: _netns_pids(c.argv[3]) for c in cmds}
        errors = []
        for cmd in leftover_commands([c.argv[3] for c in cmds], pids):
            proc = subprocess.run(cmd.full_argv(), capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT_S)
            self.removed.append(str(cmd))
            if proc.returncode != 0 and cmd.tool == "ip":
                errors.append(f"`{cmd}`: {proc.stderr.strip()}")
        self.executed = []
        if errors and raise_errors:
            raise NamespaceError("teardown incomplete: " + "; ".join(errors))

    # -- records

    def tcp_record(self) -> dict:
        """The host's TCP and what each worker's connections get (``netem.tcpsettings``): set
        in the workers' namespaces under tc; the host's own, compared with what was asked,
        where the workers share the launcher's namespace."""
        host = tcpsettings.read_original_host()
        links = self.plan.links.values()
        asked = [link.tcp for link in links if not link.tcp.is_default]
        if self.topo is None:
            return {"host": host.as_dict(), "set_in": "the host (no worker namespaces): "
                    "compared, not changed", "differs": tcpsettings.differences(asked, host)}
        inner = tcpsettings.read_host()    # a namespace made here starts as the workers' did
        base = tcpsettings.HostTcp(host.congestion_control, host.available, host.allowed,
                                   tcpsettings.NETNS_DEFAULT_SSAI, inner.rmem, inner.wmem)
        out = {"host": host.as_dict(), "set_in": "each worker's network namespace"}
        kinds = {link.tcp for link in links}
        if len(kinds) <= 1:     # the common case: one TCP on every link, said once
            return out | {"every_link": tcpsettings.effective(next(iter(kinds), TcpSettings()),
                                                              base)}
        return out | {"links": [{"src": s, "dst": d, **tcpsettings.effective(link.tcp, base)}
                                for (s, d), link in sorted(self.plan.links.items())]}

    def dry_run_text(self) -> str:
        head = [f"# shaper: {self.decision.shaper} ({self.decision.reason})",
                f"# delay: {self.decision.delay}; mode: {self.mode}; run id: {self.run_id}"]
        if self.spec is not None:
            head.append(f"# the workers shape ({self.spec['mode']}): each sender queues at most "
                        f"{self.spec['max_queue_s']:g} s of data a link")
        if not self.commands:
            return "\n".join(head + ["# nothing to create"])
        line = ([f"ip netns exec {self.topo.switch_ns} {sys.executable} -m netem.packetline "
                 "SPEC.json   # the packet delay line: every link's delay, jitter and loss"]
                if self.runs_line else [])
        teardown = [f"# on exit: {c}" for c in teardown_commands(self.topo)] if self.topo else []
        return "\n".join(head + [str(c) for c in self.commands] + line + teardown)

    def describe(self, include_commands: bool = True) -> dict:
        """For the run record: decision, capabilities, configured links, addresses, commands run.

        Large runs have many commands (N(N-1) x 7: 28,740 at 64 workers); leave them out with
        ``include_commands=False`` (``dry_run_text`` still lists them).
        """
        return {"mode": self.mode, "run_id": self.run_id, "dry_run": self.dry_run,
                "decision": self.decision.as_dict(), "plan": self.plan.describe(),
                "workers": [{"rank": k, "address": self.address(k), "port": self.port(k),
                             "netns": self.netns(k)} for k in range(self.plan.workers)],
                "shaping_spec": self.spec,
                "commands": [str(c) for c in (self.executed or self.commands)] if include_commands
                else len(self.executed or self.commands),
                "removed": list(self.removed)}
