"""``netem measure`` across emulated hosts whose links are shaped and delayed as a run's are.

``hosts.py`` builds three hosts (198.18.0.1-3 on a switch) with a profile of its own on their
links: HTB on each host's eth0 sets a rate per directed link, and the packet line in the switch
delays every packet (this kernel has no netem). One ``gasloc-emu netem measure`` runs in each
host, launched by hand like a multi-node run; what node 0 writes is compared with the profile
the hosts were built with: rate within 5 %, RTT within 1 ms. A kill -9 of one host's agent in
the middle of a transfer must end the others, failed, within a bounded time, with nothing of
theirs left running or listening in any host.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gasloc_emu import config
from gasloc_emu.plan import build_plan

HOSTS = Path(__file__).with_name("hosts.py")
REPO = Path(__file__).resolve().parents[2]
SECRET = {"GASLOC_SECRET": "measure test secret, not a real one"}
ADDRS = ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
# the hosts' links: (src, dst) -> rate Mbit/s; each pair's one-way latency, both directions
RATES = {(0, 1): 20.0, (1, 0): 40.0, (0, 2): 30.0, (2, 0): 25.0, (1, 2): 50.0, (2, 1): 35.0}
LATENCY_MS = {(0, 1): 3.0, (0, 2): 8.0, (1, 2): 5.0}
PAIR_S = 5.0
BOUNDS = ["--max-bytes-per-pair", "4000000", "--max-seconds-per-pair", str(PAIR_S),
          "--max-seconds", "60", "--pings", "20"]


def _latency(i: int, j: int) -> float:
    return LATENCY_MS[(min(i, j), max(i, j))]


def _profile(tmp_path: Path, hosts: int) -> Path:
    lines = ["[default]", "rate_mbit = 30", "latency_ms = 0"]
    for (i, j), rate in RATES.items():
        if max(i, j) >= hosts:
            continue
        lines += ["[[link]]", f"src = {i}", f"dst = {j}", f"rate_mbit = {rate}",
                  f"latency_ms = {_latency(i, j)}"]
    path = tmp_path / "hosts-links.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _hosts(tmp_path: Path, nodes: list[dict], kill: dict | None = None,
           timeout_s: float = 120.0) -> dict:
    args = {"hosts": len(nodes), "nodes": nodes, "kill": kill, "timeout_s": timeout_s,
            "log_dir": str(tmp_path),
            "net": {"bw_profile": str(_profile(tmp_path, len(nodes))), "delay": "packet-line"}}
    proc = subprocess.run([sys.executable, str(HOSTS), json.dumps(args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s + 60)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"hosts.py failed: {proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _node(rank: int, out: Path, *extra: str) -> dict:
    argv = [sys.executable, "-m", "gasloc_emu", "netem", "measure", "--nnodes", "3",
            "--node-rank", str(rank), "--master-addr", ADDRS[0], "--master-port", "29400",
            "--out", str(out), "--hosts", ",".join(ADDRS), *BOUNDS, *extra]
    return {"host": rank, "argv": argv, "env": SECRET}


def test_measured_rates_and_rtts_match_the_shaped_links(tc_caps, tmp_path):
    out = tmp_path / "measured.json"
    result = _hosts(tmp_path, [_node(k, out) for k in range(3)])
    for i, node in enumerate(result["nodes"]):
        assert node["rc"] == 0, f"node {i} exited {node['rc']}: {node['err'][-2000:]}"
    assert result["left"] == {} and result["listeners"] == {}, result
    doc = json.loads(out.read_text())
    assert [s["addr"] for s in doc["site"]] == ADDRS
    rows = []
    for link in doc["site_link"]:
        key = (link["src"], link["dst"])
        rtt = link["measured"]["rtt_ms"]["median_ms"]
        rows.append((key, RATES[key], link["rate_mbit"], 2 * _latency(*key), rtt,
                     link["measured"]["ended_by"]))
    print("\nlink   rate configured/measured Mbit/s   RTT configured/measured ms   ended by")
    for key, rate, got, rtt_cfg, rtt, ended in rows:
        print(f"{key[0]}->{key[1]}   {rate:6.1f} / {got:7.2f} ({got / rate - 1:+.1%})"
              f"            {rtt_cfg:5.1f} / {rtt:6.2f}                 {ended}")
    assert sorted(r[0] for r in rows) == sorted(RATES)
    for key, rate, got, rtt_cfg, rtt, _ in rows:
        assert got == pytest.approx(rate, rel=0.05), (key, got, rate)
        assert abs(rtt - rtt_cfg) <= 1.0, (key, rtt, rtt_cfg)
    for link in doc["site_link"]:   # within the bounds, as the sender and receiver saw it
        m = link["measured"]
        assert m["seconds"] <= PAIR_S and m["goodput"]["bytes"] <= 4_000_000
        assert m["sender_tcp_info"]["bytes_written"] <= 4_000_000
    # what run and simulate would take: one worker per host, the measured links
    cfg = config.resolve(None, {}, ["workers=3", f"net.bw_profile={out}", "model.preset=tiny"])
    links = build_plan(cfg).link_plan.links
    assert links[(1, 0)].rate_mbit == next(r[2] for r in rows if r[0] == (1, 0))


@pytest.mark.parametrize("killed", [2, pytest.param(0, marks=pytest.mark.slow)])
def test_a_killed_agent_ends_the_others_and_leaves_nothing_behind(tc_caps, tmp_path, killed):
    """An agent is killed 0.6 s into pair 0->2 (its transfer under way): host 2's (the
    receiver), or node 0's (the sender, which hosts the store). The others end failed within a
    pair's bound and a few seconds of grace, leaving no process or listener in any host."""
    out = tmp_path / "measured.json"
    kill = {"node": killed, "after_s": 0.6, "output": {"node": 1, "text": "pair 1->0:"}}
    result = _hosts(tmp_path, [_node(k, out) for k in range(3)], kill=kill)
    assert result["nodes"][killed]["rc"] == -9
    for i in {0, 1, 2} - {killed}:
        node = result["nodes"][i]
        assert node["rc"] == 1, f"node {i} exited {node['rc']}: {node['err'][-2000:]}"
        assert node["after_kill_s"] < PAIR_S + 15, node["after_kill_s"]
        assert "error: node" in node["err"], node["err"]
    assert result["left"] == {} and result["listeners"] == {}, result
    assert not out.exists()


@pytest.mark.slow
def test_under_slurm_two_hosts_meet_from_the_environment(tc_caps, tmp_path):
    """The same measurement launched as ``srun --ntasks-per-node 1`` would: no node flags, the
    role, the master (the node list's first host) and the port from Slurm's environment."""
    out = tmp_path / "measured.json"
    nodes = []
    for k in range(2):
        env = SECRET | {"SLURM_NODEID": str(k), "SLURM_NNODES": "2", "SLURM_JOB_ID": "7",
                        "SLURM_JOB_NODELIST": "198.18.0.[1-2]"}
        argv = [sys.executable, "-m", "gasloc_emu", "netem", "measure", "--out", str(out),
                *BOUNDS]
        nodes.append({"host": k, "argv": argv, "env": env})
    result = _hosts(tmp_path, nodes)
    for i, node in enumerate(result["nodes"]):
        assert node["rc"] == 0, f"node {i} exited {node['rc']}: {node['err'][-2000:]}"
    assert result["left"] == {} and result["listeners"] == {}, result
    doc = json.loads(out.read_text())
    got = {(lk["src"], lk["dst"]): lk["rate_mbit"] for lk in doc["site_link"]}
    assert got == pytest.approx({(0, 1): RATES[(0, 1)], (1, 0): RATES[(1, 0)]}, rel=0.05)
