"""Pure parts of host tc: which links leave a host, the commands for them, what is ours."""
from __future__ import annotations

import pytest

from gasloc_emu.config import NetConfig
from netem.capabilities import CapabilityError
from netem.commands import htb_rate_bps
from netem.hosttc import (
    check_host_plan,
    has_net_admin,
    host_links,
    run_handle,
    setup_commands,
    teardown_commands,
)
from netem.profiles import build_link_plan

A, B = "198.18.0.1", "198.18.0.2"


def _plan(workers=4, **net):
    return build_link_plan(NetConfig(**({"bw_profile": "uniform", "rate_mbit": 8.0} | net)),
                           workers, 0)


def _bases(workers=4, per_node=2, n=4):
    """Workers 0..per_node-1 on A, the rest on B; each with n ports from its base."""
    return {r: (A if r < per_node else B, 30000 + (r % per_node) * n) for r in range(workers)}


def _dev(addr: str) -> str:
    return "lo" if addr == A else "eth0"


def test_links_leaving_a_host_go_to_the_port_of_their_sender():
    links = host_links(_plan(), [0, 1], _bases(), _dev)
    assert [(lk.src, lk.dst) for lk in links] == [(0, 1), (0, 2), (0, 3), (1, 0), (1, 2), (1, 3)]
    one_to_two = next(lk for lk in links if (lk.src, lk.dst) == (1, 2))
    assert (one_to_two.addr, one_to_two.port, one_to_two.dev) == (B, 30000 + 1, "eth0")
    zero_to_one = next(lk for lk in links if (lk.src, lk.dst) == (0, 1))
    assert (zero_to_one.addr, zero_to_one.port, zero_to_one.dev) == (A, 30004, "lo")
    assert {lk.rate_mbit for lk in links} == {8.0}


def test_every_link_gets_its_own_class_and_filters_on_address_and_port():
    links = host_links(_plan(), [0, 1], _bases(), _dev)
    handle = run_handle("abc123")
    cmds = [str(c) for c in setup_commands(links, 1500, handle)]
    h = f"{handle:x}"
    roots = [c for c in cmds if "qdisc replace" in c]
    assert roots == [f"tc qdisc replace dev eth0 root handle {h}: htb",
                     f"tc qdisc replace dev lo root handle {h}: htb"]
    bulk = [c for c in cmds if "filter add" in c and "0xff80" not in c]
    assert len(bulk) == len(links) and len(set(bulk)) == len(links)
    assert any(f"dev eth0 parent {h}: protocol ip prio 2 u32 match ip dst {B}/32 match ip dport "
               f"30001 0xffff flowid" in c for c in bulk)
    rate = f"rate {htb_rate_bps(8.0, 1500)}bit ceil {htb_rate_bps(8.0, 1500)}bit"
    assert sum(rate in c for c in cmds) == len(links)  # L2-corrected, one link class each
    assert sum("prio 0" in c and "class add" in c for c in cmds) == len(links)  # ACK children


def test_teardown_removes_only_roots_on_the_devices_used():
    assert [str(c) for c in teardown_commands(["eth0", "lo"])] == [
        "tc qdisc del dev eth0 root", "tc qdisc del dev lo root"]


def test_run_handles_are_ours_and_stable():
    assert run_handle("0") == 0x4000 and run_handle("ffffff") < 0x8000
    assert run_handle("abc123") == run_handle("abc123") != run_handle("abc124")


@pytest.mark.parametrize("net, needs", [
    ({"jitter_ms": 1.0, "latency_ms": 5.0}, "jitter_ms"),
    ({"loss_pct": 1.0}, "loss_pct"),
])
def test_what_host_tc_cannot_do_is_refused_before_anything_runs(net, needs):
    with pytest.raises(CapabilityError, match=needs):
        check_host_plan(_plan(**net))


def test_caps_are_refused(tmp_path):
    profile = tmp_path / "caps.toml"
    profile.write_text("[default]\nrate_mbit = 8\n[[worker]]\nid = 1\nup_mbit = 2\n")
    with pytest.raises(CapabilityError, match="caps"):
        check_host_plan(build_link_plan(NetConfig(bw_profile=str(profile)), 4, 0))


@pytest.mark.parametrize("capeff, ok", [
    ("000001ffffffffff", True), ("0000000000001000", True), ("0000000000000000", False),
    ("0000000000000fff", False),
])
def test_cap_net_admin_is_bit_12_of_the_effective_set(capeff, ok):
    assert has_net_admin(f"Name:\tx\nCapEff:\t{capeff}\n") is ok
