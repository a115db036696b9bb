"""Nothing of a run outlives it: after kill -9 of the process that built the namespaces, no
process, namespace, veth or qdisc remains (in user-namespace mode by itself; in root mode after
``clean_leftovers``). A namespace's veths, bridge and qdiscs exist exactly as long as the
namespace, and a namespace exists while a process, an open fd or a mount refers to it; so
"nothing remains" is checked as "no process, fd or mount anywhere refers to its inode".
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
from needs import root_or_unavailable

from netem.namespaces import clean_leftovers

GONE_WITHIN_S = 10.0



def _references(inodes: set[int]) -> list[str]:
    """Every process, fd or mount (in any mount namespace) that refers to one of ``inodes``."""
    tags = {f"net:[{i}]" for i in inodes}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        found += _process_refs(proc, tags)
    return found


def _process_refs(proc: Path, tags: set[str]) -> list[str]:
    out = []
    try:
        if os.readlink(proc / "ns" / "net") in tags:
            out.append(f"process {proc.name} runs in it")
        for fd in (proc / "fd").iterdir():
            try:
                if os.readlink(fd) in tags:
                    out.append(f"process {proc.name} holds fd {fd.name}")
            except OSError:
                continue
        mounts = (proc / "mountinfo").read_text()
        out += [f"mounted in the mount namespace of {proc.name}" for t in tags if t in mounts]
    except OSError:
        pass    # the process ended while we looked
    return out


def _host_state() -> tuple[str, str, str]:
    def run(*a: str) -> str:
        return subprocess.run(a, capture_output=True, text=True, timeout=10).stdout

    links = "\n".join(sorted(line.split(":")[1].strip()
                             for line in run("ip", "-o", "link").splitlines()))
    return run("ip", "netns", "list"), links, run("tc", "qdisc", "show")


def _wait_until(predicate, timeout_s: float = GONE_WITHIN_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def _hold_and_kill(scenario, alive, args: dict) -> dict:
    proc = scenario.start({"action": "hold", "workers": 4, "children": 3, "hold_s": 30.0,
                           "net": {"bw_profile": "uniform", "rate_mbit": 20.0}} | args)
    try:
        info = scenario.read(proc)
        children = info["children"]
        assert all(alive(p) for p in children)
        inodes = set(info["netns_inodes"].values())
        assert len(inodes) == 5 and _references(inodes)       # the check sees live namespaces
    finally:
        proc.send_signal(signal.SIGKILL)                      # the process we started, by its id
        proc.wait(timeout=10)
    assert _wait_until(lambda: not any(alive(p) for p in children)), \
        f"worker processes survived: {[p for p in children if alive(p)]}"
    return info


def test_kill9_of_userns_launcher_leaves_nothing(tc_caps, scenario, alive):
    before = _host_state()
    info = _hold_and_kill(scenario, alive, {"reexec": True})
    assert info["mode"] == "userns"
    inodes = set(info["netns_inodes"].values())
    assert _wait_until(lambda: not _references(inodes)), _references(inodes)
    assert _host_state() == before          # no namespace name, link or qdisc on the host


def test_kill9_of_a_launcher_with_a_packet_line_leaves_nothing(tc_caps, scenario, alive):
    if not tc_caps.has("packet"):
        pytest.skip("no raw packet sockets here: no packet line to leave behind")
    before = _host_state()
    info = _hold_and_kill(scenario, alive, {"reexec": True, "net": {
        "bw_profile": "uniform", "rate_mbit": 20.0, "latency_ms": 10.0, "delay": "packet-line"}})
    assert info["packet_line"] is not None
    assert _wait_until(lambda: not alive(info["packet_line"])), "the packet line survived"
    inodes = set(info["netns_inodes"].values())
    assert _wait_until(lambda: not _references(inodes)), _references(inodes)
    assert _host_state() == before


def test_kill9_of_root_launcher_is_cleaned_by_clean_leftovers(tc_caps, scenario, alive):
    root_or_unavailable()
    run_id = secrets.token_hex(4)
    info = _hold_and_kill(scenario, alive, {"reexec": False, "run_id": run_id})
    assert info["mode"] == "root"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"gl{run_id}-sw" in listed                     # root mode leaves names behind ...
    removed = clean_leftovers(run_id, echo=lambda line: None)
    assert sorted(c.split()[-1] for c in removed if " netns del " in c) == \
        sorted(info["netns_inodes"])                       # ... exactly ours, and all of them
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"gl{run_id}" not in listed
    inodes = set(info["netns_inodes"].values())
    assert _wait_until(lambda: not _references(inodes)), _references(inodes)
