"""NetworkSession in root mode (the host's namespace, run-prefixed names), in this process:
bad input fails before anything exists, and a failure half-way undoes what was made."""
from __future__ import annotations

import json
import secrets
import subprocess

import pytest
from needs import root_or_unavailable

from gasloc_emu.config import NetConfig
from netem.capabilities import CapabilityError, choose_shaper
from netem.commands import Command
from netem.namespaces import NamespaceError, NetworkSession
from netem.profiles import ProfileError, build_link_plan


@pytest.fixture
def root(tc_caps):
    root_or_unavailable()
    return tc_caps


def _our_netns(run_id: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"gl{run_id}-")]


def _host_netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


BAD_FILES = {
    "worker id too big": {"link": [{"src": 0, "dst": 9, "rate_mbit": 5}]},
    "src == dst": {"link": [{"src": 2, "dst": 2, "rate_mbit": 5}]},
    "zero rate": {"default": {"rate_mbit": 0}},
    "latency out of range": {"link": [{"src": 0, "dst": 1, "latency_ms": 20000}]},
    "unknown key": {"link": [{"src": 0, "dst": 1, "bandwidth": 5}]},
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_bad_profiles_fail_before_anything_is_created(root, tmp_path, name):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(BAD_FILES[name]))
    before = _host_netns()
    with pytest.raises(ProfileError):
        plan = build_link_plan(NetConfig(bw_profile=str(path)), 4, 0)
        NetworkSession(plan, choose_shaper("tc", root), secrets.token_hex(3)).start()
    assert _host_netns() == before


def test_what_the_kernel_cannot_do_fails_before_anything_is_created(root):
    if root.has("netem"):
        pytest.skip("this kernel has netem, so the netem delay mode is possible")
    plan = build_link_plan(NetConfig(bw_profile="uniform", latency_ms=5.0, jitter_ms=5.0), 3, 0)
    before = _host_netns()
    with pytest.raises(CapabilityError, match="net.delay = 'netem' is not possible here"):
        NetworkSession(plan, choose_shaper("tc", root, delay="netem"), secrets.token_hex(3))
    with pytest.raises(CapabilityError, match="jitter"):
        NetworkSession(plan, choose_shaper("tc", root, delay="release-queue"),
                       secrets.token_hex(3))
    assert _host_netns() == before


def test_failure_half_way_removes_what_was_made(root):
    plan = build_link_plan(NetConfig(bw_profile="uniform"), 3, 0)
    run_id = secrets.token_hex(3)
    session = NetworkSession(plan, choose_shaper("tc", root), run_id)
    assert session.mode == "root"
    broken = Command(("tc", "qdisc", "add", "dev", "nosuchdev", "root", "htb"),
                     session.topo.worker_ns(2), "a command that fails")
    session.commands = session.commands + [broken]
    with pytest.raises(NamespaceError, match="nosuchdev"), session:
        pass
    assert _our_netns(run_id) == []


def test_session_builds_and_removes_everything(root):
    plan = build_link_plan(NetConfig(bw_profile="skewed"), 3, 0)
    run_id = secrets.token_hex(3)
    with NetworkSession(plan, choose_shaper("tc", root), run_id) as net:
        assert sorted(_our_netns(run_id)) == sorted(net.topo.namespaces())
        out = subprocess.run(net.wrap(1, ["ip", "-4", "-o", "addr", "show", "dev", "eth0"]),
                             capture_output=True, text=True, timeout=10).stdout
        assert net.address(1) in out and net.bind_address(1).startswith("tcp://198.18.0.2:")
        assert len(net.describe()["commands"]) == len(net.commands)
    assert _our_netns(run_id) == []
    assert len(net.removed) == 4


def test_dry_run_creates_nothing(root):
    plan = build_link_plan(NetConfig(bw_profile="uniform", rate_mbit=10.0), 2, 0)
    before = _host_netns()
    with NetworkSession(plan, choose_shaper("tc", root), "abc", dry_run=True) as net:
        text = net.dry_run_text()
    assert "ip netns add glabc-w0" in text and "htb" in text
    assert _host_netns() == before
