"""The pure parts of namespaces.py, and sessions that create nothing (loopback, dry run)."""
from __future__ import annotations

import json
import sys

import pytest

from gasloc_emu.config import NetConfig
from netem import namespaces as N
from netem.capabilities import CapabilityError, Decision
from netem.commands import Command
from netem.profiles import build_link_plan
from netem.userspace import LinkShaper

USERSPACE = Decision("userspace", "release-queue", "test")
TC = Decision("tc", "release-queue", "test")


def plan_of(profile="uniform", workers=3, **net):
    return build_link_plan(NetConfig(bw_profile=profile, **net), workers, 0)


def test_reexec_argv():
    assert N.reexec_argv(["run", "--workers", "4"]) == \
        ["unshare", "-Urnm", "--", sys.executable, "-m", "gasloc_emu", "run", "--workers", "4"]
    assert N.reexec_argv(["x"], entry=["py", "s.py"]) == \
        ["unshare", "-Urnm", "--", "py", "s.py", "x"]


def test_batches_group_ip_and_tc_per_namespace_but_never_netns_adds():
    cmds = [Command(("ip", "netns", "add", "a")), Command(("ip", "netns", "add", "b")),
            Command(("tc", "qdisc", "add"), "a"), Command(("tc", "class", "add"), "a"),
            Command(("tc", "class", "add"), "b"), Command(("ip", "link", "set"), "b"),
            Command(("ip", "addr", "add"), "b"), Command(("mount", "x"))]
    sizes = [len(b) for b in N._batches(cmds)]
    assert sizes == [1, 1, 2, 1, 2, 1]


def test_failed_batch_line():
    assert N._failed_line("Error: nope\nCommand failed -:7\n") == 7
    assert N._failed_line("RTNETLINK answers: File exists") is None


def test_leftover_commands_kill_then_remove():
    cmds = N.leftover_commands(["glab-w0", "glab-sw"], {"glab-w0": [41, 42]})
    assert [str(c) for c in cmds] == ["kill -KILL 41", "kill -KILL 42", "ip netns del glab-w0",
                                      "ip netns del glab-sw"]


def test_run_ids_are_short_hex():
    ids = {N.new_run_id() for _ in range(20)}
    assert len(ids) > 1 and all(len(i) == 6 and int(i, 16) >= 0 for i in ids)


def test_loopback_session_for_the_userspace_shaper():
    with N.NetworkSession(plan_of(latency_ms=5.0), USERSPACE, "ab") as net:
        assert net.mode == "loopback" and net.topo is None and net.commands == []
        assert {net.address(k) for k in range(3)} == {"127.0.0.1"}
        assert len({net.port(k) for k in range(3)}) == 3
        assert net.bind_address(1) == f"tcp://127.0.0.1:{net.port(1)}"
        assert net.wrap(2, ["python", "w.py"]) == ["python", "w.py"]
        assert isinstance(net.shaping(0), LinkShaper) and net.shaping_spec()["mode"] == "userspace"
        record = json.loads(json.dumps(net.describe()))
    assert record["mode"] == "loopback" and record["decision"]["shaper"] == "userspace"
    assert "nothing to create" in net.dry_run_text()


def test_unshaped_session_has_no_shaping():
    net = N.NetworkSession(plan_of(""), Decision("none", "none", "off"), "ab")
    assert net.shaping(0) is None and net.shaping_spec() is None


def test_tc_dry_run_lists_commands_and_teardown(monkeypatch):
    monkeypatch.setattr(N.os, "geteuid", lambda: 1000)     # neither root nor in our namespace
    monkeypatch.delenv(N.ENV_FLAG, raising=False)
    net = N.NetworkSession(plan_of(workers=2), TC, "abc", dry_run=True)
    assert net.mode == "userns"
    assert net.wrap(1, ["python"]) == ["ip", "netns", "exec", "glabc-w1", "python"]
    assert net.bind_address(0) == f"tcp://198.18.0.1:{N.BASE_PORT}"
    text = net.dry_run_text()
    assert "ip netns add glabc-sw" in text
    assert "tc -n glabc-w0 qdisc add dev eth0 root handle 1: htb" in text
    assert "# on exit: ip netns del glabc-w1" in text
    net.start()
    net.close()       # nothing was run, so nothing to remove
    assert net.executed == [] and net.removed == []


def test_tc_without_namespace_or_root_is_refused(monkeypatch):
    monkeypatch.setattr(N.os, "geteuid", lambda: 1000)
    monkeypatch.delenv(N.ENV_FLAG, raising=False)
    with pytest.raises(CapabilityError, match="reexec_in_userns"):
        N.NetworkSession(plan_of(), TC, "abc")


def test_prepare_userns_refuses_outside_our_namespace(monkeypatch):
    monkeypatch.delenv(N.ENV_FLAG, raising=False)
    monkeypatch.setattr(N, "_prepared", False)
    with pytest.raises(N.NamespaceError, match="refusing to mount"):
        N.prepare_userns()


def test_reexec_returns_false_without_user_namespaces(monkeypatch):
    monkeypatch.delenv(N.ENV_FLAG, raising=False)
    monkeypatch.setattr(N, "userns_works", lambda: False)
    assert N.reexec_in_userns(["run"]) is False
