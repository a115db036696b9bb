"""A launcher in miniature for the net tests: ``python tests/net/scenario.py '<json args>'``.

It does what the real launcher does (re-exec into a user namespace unless ``reexec`` is false,
build the link plan, open a ``NetworkSession``) and then one action, printing one line
``RESULT <json>`` on stdout:

- ``probe``: measure the links with ``netem.probe.probe_links``; the rows.
- ``hold``:  start ``children`` sleeping processes inside worker namespaces (dying with us),
             report pids and namespace inodes, then wait to be killed (at most ``hold_s``).
- ``syntax``: run every command of a netem plan one by one (see ``_syntax``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from gasloc_emu.config import NetConfig
from netem.capabilities import choose_shaper, probe
from netem.namespaces import NetworkSession, die_with_parent, reexec_in_userns
from netem.probe import probe_links
from netem.profiles import build_link_plan


def _result(obj: dict) -> None:
    print("RESULT " + json.dumps(obj), flush=True)


def _probe(session: NetworkSession, args: dict) -> None:
    rows = probe_links(session, pairs=args.get("pairs"), seconds_per_link=args.get("seconds", 2.0),
                       parallel=args.get("parallel", True), pings=args.get("pings", 10))
    _result({"rows": rows, "describe": session.describe(),
             "packet_line": session.packet_line_stats()})


def _hold(session: NetworkSession, args: dict) -> None:
    children = []
    for k in range(args.get("children", 2)):
        argv = session.wrap(k, [sys.executable, "-c", "import time; time.sleep(120)"])
        children.append(subprocess.Popen(argv, preexec_fn=die_with_parent))
    time.sleep(0.3)   # let ip netns exec hand over to python
    inodes = {ns: os.stat(f"/run/netns/{ns}").st_ino for ns in session.topo.namespaces()}
    line = session.line.proc.pid if session.line is not None else None
    _result({"pid": os.getpid(), "children": [c.pid for c in children], "netns_inodes": inodes,
             "run_id": session.run_id, "mode": session.mode, "packet_line": line})
    time.sleep(args.get("hold_s", 60.0))


def _syntax(plan, args: dict) -> None:
    """Run every command of a plan that uses netem, one by one, whatever this kernel has.

    Where the kernel lacks netem, tc still parses the netem arguments before the kernel refuses
    the qdisc kind, so every command's syntax is checked; the rest really runs.
    """
    from netem.capabilities import Decision
    from netem.namespaces import NamespaceError, prepare_userns, run_commands
    decision = Decision("tc", "netem", "syntax check", probe())
    session = NetworkSession(plan, decision, args.get("run_id"))
    prepare_userns()
    failures = []
    for cmd in session.commands:
        try:
            run_commands([cmd])
        except NamespaceError as exc:
            failures.append({"command": str(cmd), "error": str(exc)})
    _result({"commands": len(session.commands), "failures": failures,
             "netem_commands": sum("netem" in c.argv for c in session.commands)})


def main(argv: list[str]) -> int:
    args = json.loads(argv[0])
    if args.get("reexec", True) and not reexec_in_userns(
            argv, entry=[sys.executable, os.path.abspath(__file__)]):
        sys.exit("user namespaces do not work here")
    net = NetConfig(**args.get("net", {}))
    plan = build_link_plan(net, args["workers"], args.get("seed", 0))
    if args["action"] == "syntax":
        _syntax(plan, args)
        return 0
    decision = choose_shaper(args.get("shaper", "tc"), probe(), delay=net.delay)
    with NetworkSession(plan, decision, args.get("run_id")) as session:
        {"probe": _probe, "hold": _hold}[args["action"]](session, args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
