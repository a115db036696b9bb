"""Emulated hosts for the multi-node tests: ``python tests/net/hosts.py '<json args>'``.

It re-executes itself into a user namespace, builds ``hosts`` network namespaces on a bridge
(``netem.commands``' topology: host k is 198.18.0.<k+1> on its ``eth0``, like machines on a
LAN), starts one command per node inside its host (``ip netns exec``), and prints one line
``RESULT <json>``: each node's exit code, output and run time, how long after an injected kill
the others ended, and the processes left in the hosts (there must be none). Everything it
built goes away with its user namespace.

args: ``hosts``; ``nodes``: [{"host": k, "argv": [...], "env": {...}}]; ``kill``: optional
{"node": i, "after_s": t} (SIGKILL to that node's agent t s after the start), or with
``"training": {"metrics": PATH, "workers": [...]}`` t s after each of those workers has a row
in the record's metrics.jsonl (training is under way there, however busy the machine; with
``"rows": n`` too, once the record has n rows: a given round), or
with ``"output": {"node": k, "text": "..."}`` t s after node k's stdout has that text;
``kill`` may also be a list of such kills, each armed and fired on its own (``after_kill_s``:
since the last one fired); a kill with ``"restart_after_s": t`` starts that node's command
again t s after it (the host's agent started again by hand; its output: ``back_out``,
``back_err``, and ``rc`` is then the new process's); ``timeout_s``; ``net``: optional net.*
settings (a ``bw_profile`` with the hosts as its workers, ``delay``): the links between the
hosts are then shaped and delayed as a run's would be (``NetworkSession``: HTB on each host's
eth0, the packet line as the switch), and ``listeners`` reports the TCP listeners left in each host.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from netem.commands import NetTopology, topology_commands
from netem.namespaces import (
    _netns_pids,
    die_with_parent,
    new_run_id,
    prepare_userns,
    reexec_in_userns,
    run_commands,
)


def host_addr(k: int) -> str:
    return NetTopology("0", k + 1).address(k)


def _start(topo: NetTopology, node: dict, log_dir: str, i: int,
           name: str = "node") -> subprocess.Popen:
    argv = ["ip", "netns", "exec", topo.worker_ns(node["host"]), *node["argv"]]
    env = os.environ | {"PYTHONUNBUFFERED": "1"} | node.get("env", {})
    out = open(os.path.join(log_dir, f"{name}{i}.out"), "w")  # noqa: SIM115 - closed by the OS
    err = open(os.path.join(log_dir, f"{name}{i}.err"), "w")  # noqa: SIM115
    return subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=node.get("cwd"),
                            preexec_fn=die_with_parent)


def _training(watch: dict) -> bool:
    """Whether every worker in ``watch["workers"]`` has a row in ``watch["metrics"]``."""
    try:
        with open(watch["metrics"]) as fh:
            rows = [json.loads(line) for line in fh if line.endswith("\n")]
    except (OSError, ValueError):
        return False
    return set(watch["workers"]) <= {r.get("worker") for r in rows} and \
        len(rows) >= watch.get("rows", 0)


def _printed(watch: dict, log_dir: str) -> bool:
    """Whether node ``watch["node"]``'s stdout has ``watch["text"]``."""
    try:
        return watch["text"] in Path(log_dir, f"node{watch['node']}.out").read_text()
    except OSError:
        return False


def _armed(kill: dict, log_dir: str) -> bool:
    if "training" in kill:
        return _training(kill["training"])
    return _printed(kill["output"], log_dir)


def _wait_all(procs, kill, timeout_s: float, log_dir: str,
              restart=None) -> tuple[dict, float | None]:
    """Wait for every node, killing as ``kill`` says (one kill, or a list of them, each
    armed and fired on its own) and starting a node again where a kill says
    (``restart(node)``: its new process); the time of the last kill fired."""
    kills = [] if not kill else [kill] if isinstance(kill, dict) else list(kill)
    t0, ended, killed_at = time.monotonic(), {}, None
    armed_at = [t0 if "training" not in k and "output" not in k else None for k in kills]
    fired, restarted = [None] * len(kills), [False] * len(kills)
    while len(ended) < len(procs) and time.monotonic() - t0 < timeout_s:
        for i, k in enumerate(kills):
            if armed_at[i] is None and _armed(k, log_dir):
                armed_at[i] = time.monotonic()   # the kill's clock starts here
            if fired[i] is None and armed_at[i] is not None and \
                    time.monotonic() - armed_at[i] >= k["after_s"]:
                procs[k["node"]].send_signal(signal.SIGKILL)
                procs[k["node"]].wait()
                fired[i] = killed_at = time.monotonic()
            if fired[i] is not None and not restarted[i] and "restart_after_s" in k and \
                    time.monotonic() - fired[i] >= k["restart_after_s"]:
                procs[k["node"]] = restart(k["node"])
                ended.pop(k["node"], None)
                restarted[i] = True
        for i, p in enumerate(procs):
            if i not in ended and p.poll() is not None:
                ended[i] = (p.returncode, time.monotonic())
        time.sleep(0.05)
    for i, p in enumerate(procs):
        if i not in ended:
            p.kill()
            ended[i] = (None, time.monotonic())
    return ended, killed_at


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    if not reexec_in_userns(argv, entry=[sys.executable, os.path.abspath(__file__)]):
        sys.exit("user namespaces do not work here")
    prepare_userns()
    session = _shaped(args) if args.get("net") else None
    if session is None:
        topo = NetTopology(new_run_id(), args["hosts"])
        run_commands(topology_commands(topo))
        for k in range(args["hosts"]):
            run_commands(_lo_up(topo, k))
    else:
        topo = session.topo
    log_dir = args["log_dir"]
    t0 = time.monotonic()
    procs = [_start(topo, node, log_dir, i) for i, node in enumerate(args["nodes"])]
    ended, killed_at = _wait_all(
        procs, args.get("kill"), args.get("timeout_s", 240.0), log_dir,
        lambda i: _start(topo, args["nodes"][i], log_dir, i, name="back"))
    time.sleep(0.5)  # what dies with its parent has had time to go
    hosts = [topo.worker_ns(k) for k in range(args["hosts"])]   # the switch runs the line
    left = {ns: _netns_pids(ns) for ns in hosts}
    listeners = {ns: _listeners(ns) for ns in hosts}
    if session is not None:
        session.close()
    nodes = [{"rc": ended[i][0], "seconds": ended[i][1] - t0,
              "after_kill_s": None if killed_at is None else ended[i][1] - killed_at,
              "out": Path(log_dir, f"node{i}.out").read_text()[-4000:],
              "err": Path(log_dir, f"node{i}.err").read_text()[-4000:]}
             | _back_output(log_dir, i) for i in range(len(procs))]
    print("RESULT " + json.dumps({"nodes": nodes, "left": {k: v for k, v in left.items() if v},
                                  "listeners": {k: v for k, v in listeners.items() if v},
                                  "addrs": [host_addr(k) for k in range(args["hosts"])]}),
          flush=True)
    return 0


def _back_output(log_dir: str, i: int) -> dict:
    """A node started again after its kill: its new process's output."""
    if not Path(log_dir, f"back{i}.out").exists():
        return {}
    return {"back_out": Path(log_dir, f"back{i}.out").read_text()[-4000:],
            "back_err": Path(log_dir, f"back{i}.err").read_text()[-4000:]}


def _shaped(args: dict):
    """The hosts' network as a run would shape it: ``args["net"]``'s profile over the hosts."""
    from gasloc_emu.config import NetConfig
    from netem.capabilities import choose_shaper, probe
    from netem.namespaces import NetworkSession
    from netem.profiles import build_link_plan
    net = NetConfig(**args["net"])
    plan = build_link_plan(net, args["hosts"], 0)
    session = NetworkSession(plan, choose_shaper("tc", probe(), delay=net.delay))
    session.start()
    return session


def _listeners(ns: str) -> list[str]:
    """The TCP sockets listening in a host (``ss``: independent of the code under test)."""
    proc = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Htln"], capture_output=True,
                          text=True, timeout=10)
    return [line for line in proc.stdout.splitlines() if line.strip()]


def _lo_up(topo: NetTopology, k: int):
    from netem.commands import Command
    return [Command(("ip", "link", "set", "lo", "up"), topo.worker_ns(k))]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
