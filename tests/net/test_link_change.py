"""A link changed while the network stands: 0 -> 1 measured at 20 Mbit/s, changed in place to
5 Mbit/s with ``netem.live.link_change_commands`` (``tc class change``: the filters and leaf
queues set up with the network stay), measured again; then cut (its leaf queues closed) and
restored to 20 Mbit/s, measured a third time. Every rate within 5 % (the 20 Mbit/s readings
15 % below while the hypervisor takes 5 % or more of the host's CPU time: the tc shortfall).

The test runs this file as a script, ``python test_link_change.py '<json>'``, which does what the
launcher does (re-exec into its own user namespace, ``NetworkSession``), measures with
``netem.probe`` and prints one line ``RESULT <json>``. Where worker 1 can have a download cap
(ifb, ingress, mirred), it gets a generous one, so that the link is enforced on worker 1's ifb
too and the change must reach that class as well.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from netem.hoststat import STEAL_NOTABLE

REPO = Path(__file__).resolve().parents[2]
BEFORE_MBIT, AFTER_MBIT = 20.0, 5.0
DOWN_CAP_MBIT = 100.0
SECONDS = 2.5                       # bulk phase of each measurement (2 s after warm-up)
TOLERANCE = 0.05
_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}


# ---------------------------------------------------------------- the script (in the namespace)

def _measure(session, steals: list[float]) -> float:
    """The link's goodput; the host's steal share meanwhile is appended to ``steals``."""
    from netem.probe import probe_links
    rows = probe_links(session, pairs=[(0, 1)], seconds_per_link=SECONDS, pings=1)
    steals.append(rows[0]["host_steal"] or 0.0)
    return rows[0]["measured_mbit"]


def _ceil_bps(netns: str, dev: str, classid: str) -> float | None:
    """The ceil tc reports for one class (tc prints e.g. ``ceil 5227Kbit``), None if absent."""
    out = subprocess.run(["tc", "-n", netns, "class", "show", "dev", dev, "classid", classid],
                         capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"\bceil (\d+(?:\.\d+)?)([KMG]?)bit", out)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def _classes(session) -> dict:
    topo = session.topo
    # the bulk child (1:12) holds the link's rate; its parent (1:10) adds room for the reverse
    # link's ACKs (netem.commands.ack_headroom_bps)
    return {"egress": _ceil_bps(topo.worker_ns(0), "eth0", "1:12"),
            "ifb": _ceil_bps(topo.worker_ns(1), "ifb0", "1:12")}


def _leaf_limits(session) -> list[int | None]:
    """The limits of the ACK and bulk leaves of 0 -> 1 (tc prints ``limit 1000p``)."""
    out = []
    for parent in ("1:11", "1:12"):
        text = subprocess.run(["tc", "-n", session.topo.worker_ns(0), "qdisc", "show", "dev",
                               "eth0", "parent", parent], capture_output=True, text=True,
                              timeout=10).stdout
        m = re.search(r"\blimit (\d+)p", text)
        out.append(int(m.group(1)) if m else None)
    return out


def _scenario(args: dict) -> dict:
    from gasloc_emu.config import NetConfig
    from netem.capabilities import choose_shaper, probe
    from netem.live import LiveLinks, link_change_commands
    from netem.namespaces import NetworkSession, run_commands
    from netem.profiles import build_link_plan
    plan = build_link_plan(NetConfig(bw_profile=args["profile"]), 2, 0)
    decision = choose_shaper("tc", probe())
    steals: list[float] = []
    with NetworkSession(plan, decision) as session:
        before = _measure(session, steals)
        change = link_change_commands(plan, session.topo, decision, 0, 1, rate_mbit=AFTER_MBIT)
        run_commands(change)
        after = _measure(session, steals)
        out = {"before_mbit": before, "after_mbit": after, "classes": _classes(session),
               "commands": [str(c) for c in change]}
        # the same change, kept by the LiveLinks a run with more than one change holds
        live = LiveLinks(plan, session.topo, decision)
        out["same_as_live"] = [str(c) for c in live.change(0, 1, rate_mbit=AFTER_MBIT)] \
            == out["commands"]
        run_commands(live.change(0, 1, rate_mbit=0))
        out["cut_leaf_limits"] = _leaf_limits(session)
        run_commands(live.change(0, 1, rate_mbit=BEFORE_MBIT))
        out["restored_mbit"] = _measure(session, steals)
        return out | {"steal": max(steals)}


def main(argv: list[str]) -> int:
    from netem.namespaces import reexec_in_userns
    if not reexec_in_userns(argv, entry=[sys.executable, os.path.abspath(__file__)]):
        sys.exit("user namespaces do not work here")
    print("RESULT " + json.dumps(_scenario(json.loads(argv[0]))), flush=True)
    return 0


# ---------------------------------------------------------------- the test

def _run(args: dict, timeout_s: float = 60.0) -> dict:
    # the repository on the path, however (or whether) the package is installed
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, __file__, json.dumps(args)], capture_output=True,
                          text=True, timeout=timeout_s, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=path))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, \
        f"link change scenario failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_a_link_changed_in_place_carries_its_new_rate(tc_caps, tmp_path):
    profile = {"default": {"rate_mbit": BEFORE_MBIT}}
    with_ifb = all(tc_caps.has(f) for f in ("ifb", "ingress", "mirred"))
    if with_ifb:
        profile["worker"] = [{"id": 1, "down_mbit": DOWN_CAP_MBIT}]
    path = tmp_path / "link.json"
    path.write_text(json.dumps(profile))
    res = _run({"profile": str(path)})
    before, after, restored = res["before_mbit"], res["after_mbit"], res["restored_mbit"]
    report = (f"measured {before} Mbit/s before, {after} after, {restored} after a cut and a "
              f"restore (host steal up to {res['steal']:.1%}); commands: {res['commands']}")
    # a 20 Mbit/s link falls behind while the hypervisor takes the CPUs (HTB's 1 ms bucket:
    # docs/NETWORK.md, "Known problems"); then it is held to 15 % below, as in test_shaping
    low = 1 - (TOLERANCE if res["steal"] < STEAL_NOTABLE else 0.15)
    assert low <= before / BEFORE_MBIT <= 1 + TOLERANCE, report
    assert abs(after / AFTER_MBIT - 1) <= TOLERANCE, report
    assert res["same_as_live"], report
    assert res["cut_leaf_limits"] == [0, 0], res     # a cut: both leaves drop everything
    assert low <= restored / BEFORE_MBIT <= 1 + TOLERANCE, report
    # every class that enforces 0 -> 1 was changed: tc reads back the new ceil (L2-corrected)
    want_bps = AFTER_MBIT * 1e6 * 1514 / 1448
    kinds = ("egress", "ifb") if with_ifb else ("egress",)
    for kind in kinds:
        assert abs(res["classes"][kind] / want_bps - 1) < 0.01, (kind, res["classes"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
