"""The ip/tc commands as data: topology, per-link HTB trees, caps, delay; no kernel needed."""
from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from gasloc_emu.config import NetConfig
from netem.capabilities import Capabilities, CapabilityError, Decision
from netem.commands import (
    NETNS_RE,
    Command,
    NetTopology,
    ack_headroom_bps,
    check_supported,
    htb_rate_bps,
    overhead_factor,
    plan_commands,
    teardown_commands,
    topology_commands,
)
from netem.profiles import build_link_plan

ALL = {f: True for f in ("veth", "bridge", "ifb", "htb", "pfifo", "u32", "tbf", "netem", "ingress",
                         "mirred")}


def caps(**features) -> Capabilities:
    return Capabilities(root=True, in_userns=False, userns=True, tools=("ip", "tc", "unshare"),
                        probed_with="test", features=ALL | features,
                        errors={f: "missing" for f, ok in features.items() if not ok})


TC_NETEM = Decision("tc", "netem", "test", caps())
TC_QUEUE = Decision("tc", "release-queue", "test", caps(netem=False))


def plan_of(profile="uniform", workers=4, **net):
    return build_link_plan(NetConfig(bw_profile=profile, **net), workers, 0)


def file_plan(tmp_path, data: dict, workers=3, **net):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return build_link_plan(NetConfig(bw_profile=str(path), **net), workers, 0)


def in_ns(cmds, ns):
    return [c for c in cmds if c.netns == ns]


def args_after(cmd: Command, key: str) -> str:
    return cmd.argv[cmd.argv.index(key) + 1]


def classes(cmds, dev="eth0"):
    return [c for c in cmds if c.argv[:3] == ("tc", "class", "add") and args_after(c, "dev") == dev]


# ---------------------------------------------------------------- Command and topology

def test_command_renders_as_a_shell_line():
    assert str(Command(("tc", "qdisc", "show"), "glab-w1")) == "tc -n glab-w1 qdisc show"
    assert str(Command(("ip", "link"), "glab-sw")) == "ip -n glab-sw link"
    assert Command(("sysctl", "-w", "a=1"), "ns").full_argv() == ["ip", "netns", "exec", "ns",
                                                                   "sysctl", "-w", "a=1"]
    assert str(Command(("echo", "a b"))) == "echo 'a b'"


def test_topology_names_and_addresses():
    topo = NetTopology("a1b2c3", 300)
    assert topo.worker_ns(3) == "gla1b2c3-w3" and topo.switch_ns == "gla1b2c3-sw"
    assert topo.address(0) == "198.18.0.1" and topo.address(254) == "198.18.0.255"
    assert topo.address(255) == "198.18.1.0" and topo.address(299) == "198.18.1.44"
    assert len(set(topo.address(k) for k in range(300))) == 300
    assert all(NETNS_RE.match(ns) for ns in topo.namespaces())


@pytest.mark.parametrize("kwargs, message", [
    ({"run_id": "XYZ"}, "run_id = 'XYZ' is not allowed"),
    ({"run_id": "0123456789abc"}, "run_id"),
    ({"workers": 0}, "workers = 0 is out of range"),
    ({"mtu": 100}, "mtu = 100 is out of range"),
])
def test_topology_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NetTopology(**({"run_id": "ab", "workers": 2} | kwargs))


def test_our_names_only():
    assert NETNS_RE.match("glabc-w12") and NETNS_RE.match("gl0-sw")
    for other in ("glance", "gl-w1", "glabc-x1", "myglabc-w1", "glABC-w1", "glabc-w1x"):
        assert not NETNS_RE.match(other)


def test_topology_commands_make_namespaces_first_then_a_bridge_and_veths():
    topo = NetTopology("ab", 3, mtu=9000)
    cmds = topology_commands(topo)
    adds = [c for c in cmds if c.argv[:3] == ("ip", "netns", "add")]
    assert cmds[:4] == adds and [c.argv[3] for c in adds] == topo.namespaces()
    veths = [c for c in cmds if "veth" in c.argv]
    assert len(veths) == 3
    v = veths[1]
    assert v.netns == "glab-w1" and args_after(v, "netns") == "glab-sw"
    assert args_after(v, "mtu") == "9000"
    assert any(c.argv[-3:] == ("198.18.0.2/15", "dev", "eth0") and c.netns == "glab-w1"
               for c in cmds)
    assert any(args_after(c, "master") == "br0"
               for c in in_ns(cmds, "glab-sw") if "master" in c.argv)


def test_teardown_removes_every_namespace():
    topo = NetTopology("ab", 3)
    assert sorted(c.argv[3] for c in teardown_commands(topo)) == sorted(topo.namespaces())
    assert all(c.argv[:3] == ("ip", "netns", "del") for c in teardown_commands(topo))


# ---------------------------------------------------------------- egress trees

def test_overhead_scaling():
    assert overhead_factor(1500) == pytest.approx(1514 / 1448)
    assert htb_rate_bps(50, 1500) == round(50e6 * 1514 / 1448)
    assert htb_rate_bps(50, 9000) == round(50e6 * 9014 / 8948)


def test_each_peer_gets_a_link_class_with_ack_and_bulk_children(tmp_path):
    plan = file_plan(tmp_path, {"default": {"rate_mbit": 50},
                                "link": [{"src": 0, "dst": 2, "rate_mbit": 5}]})
    topo = NetTopology("ab", 3)
    cmds = in_ns(plan_commands(plan, topo, TC_QUEUE), "glab-w0")
    cls = classes(cmds)
    links = [c for c in cls if args_after(c, "parent") == "1:"]
    assert len(links) == 2
    for link, peer, rate in zip(links, (1, 2), (50, 5), strict=True):
        # the link's rate plus room for the ACKs of the reverse link's data (50 Mbit/s both)
        assert plan.links[(peer, 0)].rate_mbit == 50
        room = ack_headroom_bps(50, 1500)
        assert room == math.ceil(htb_rate_bps(50, 1500) * 78 / 1514)
        assert args_after(link, "rate") == args_after(link, "ceil") \
            == f"{htb_rate_bps(rate, 1500) + room}bit"
        minor = args_after(link, "classid").split(":")[1]
        kids = {args_after(c, "prio"): c for c in cls if args_after(c, "parent") == f"1:{minor}"}
        assert sorted(kids) == ["0", "1"]
        # small packets may use the whole class; bulk data never more than the link's rate
        assert args_after(kids["0"], "ceil") == args_after(link, "ceil")
        assert args_after(kids["1"], "ceil") == f"{htb_rate_bps(rate, 1500)}bit"
        assert args_after(kids["0"], "rate") == f"{room}bit"
        # children's guaranteed rates add up to the link's, never past it
        total = sum(int(args_after(c, "rate")[:-3]) for c in kids.values())
        assert total == int(args_after(link, "rate")[:-3])


def test_leaves_are_pfifo_1000_and_filters_split_small_packets():
    cmds = in_ns(plan_commands(plan_of(workers=3), NetTopology("ab", 3), TC_QUEUE), "glab-w1")
    leaves = [c for c in cmds if c.argv[:3] == ("tc", "qdisc", "add") and "pfifo" in c.argv]
    assert len(leaves) == 4 and all(args_after(c, "limit") == "1000" for c in leaves)
    filters = [c for c in cmds if c.argv[:3] == ("tc", "filter", "add")]
    assert len(filters) == 4
    small = [f for f in filters if "u16" in f.argv]
    assert len(small) == 2
    assert all(f.argv[f.argv.index("u16") + 1:][:4] == ("0x0000", "0xff80", "at", "2")
               for f in small)
    assert all(args_after(f, "prio") == "1" for f in small)
    assert {args_after(f, "dst") for f in filters} == {"198.18.0.1/32", "198.18.0.3/32"}
    # a small-packet filter points at the prio-0 child, the bulk filter at the prio-1 child
    cls = {args_after(c, "classid"): c for c in classes(cmds)}
    for f in filters:
        child = cls[args_after(f, "flowid")]
        assert args_after(child, "prio") == ("0" if f in small else "1")


def test_ids_are_unique_per_device_for_many_workers():
    cmds = plan_commands(plan_of(workers=20), NetTopology("ab", 20), TC_QUEUE)
    for ns in {c.netns for c in cmds if c.netns}:
        ids = Counter(args_after(c, "classid") for c in classes(in_ns(cmds, ns)))
        handles = Counter(args_after(c, "handle") for c in in_ns(cmds, ns) if c.argv[1] == "qdisc")
        assert all(n == 1 for n in ids.values()) and all(n == 1 for n in handles.values())


def test_uplink_cap_is_a_parent_whose_children_cannot_exceed_it(tmp_path):
    plan = file_plan(tmp_path, {"default": {"rate_mbit": 50},
                                "worker": [{"id": 0, "up_mbit": 60}]}, 4)
    cmds = in_ns(plan_commands(plan, NetTopology("ab", 4), TC_QUEUE), "glab-w0")
    cls = classes(cmds)
    cap = [c for c in cls if args_after(c, "classid") == "1:1"]
    assert len(cap) == 1 and args_after(cap[0], "rate") == f"{htb_rate_bps(60, 1500)}bit"
    links = [c for c in cls if args_after(c, "parent") == "1:1"]
    assert len(links) == 3
    assert sum(int(args_after(c, "rate")[:-3]) for c in links) <= htb_rate_bps(60, 1500)
    room = ack_headroom_bps(50, 1500)
    assert all(args_after(c, "ceil") == f"{htb_rate_bps(50, 1500) + room}bit" for c in links)
    bulk = [c for c in cls if "prio" in c.argv and args_after(c, "prio") == "1"]
    assert len(bulk) == 3
    assert all(args_after(c, "ceil") == f"{htb_rate_bps(50, 1500)}bit" for c in bulk)
    other = in_ns(plan_commands(plan, NetTopology("ab", 4), TC_QUEUE), "glab-w1")
    assert not [c for c in classes(other) if args_after(c, "classid") == "1:1"]


def test_download_cap_redirects_ingress_to_an_ifb_tree_matching_src(tmp_path):
    plan = file_plan(tmp_path, {"worker": [{"id": 2, "down_mbit": 10}]}, 3)
    cmds = in_ns(plan_commands(plan, NetTopology("ab", 3), TC_QUEUE), "glab-w2")
    assert any(c.argv[:3] == ("ip", "link", "add") and c.argv[-2:] == ("type", "ifb") for c in cmds)
    assert any("ingress" in c.argv and args_after(c, "dev") == "eth0" for c in cmds)
    mirred = [c for c in cmds if "mirred" in c.argv]
    assert len(mirred) == 1 and mirred[0].argv[-3:] == ("redirect", "dev", "ifb0")
    ifb = classes(cmds, "ifb0")
    assert args_after(ifb[0], "classid") == "1:1"
    assert args_after(ifb[0], "rate") == f"{htb_rate_bps(10, 1500)}bit"
    ifb_filters = [c for c in cmds if c.argv[1] == "filter" and args_after(c, "dev") == "ifb0"]
    assert {args_after(f, "src") for f in ifb_filters} == {"198.18.0.1/32", "198.18.0.2/32"}
    assert not [c for c in in_ns(plan_commands(plan, NetTopology("ab", 3), TC_QUEUE), "glab-w0")
                if "mirred" in c.argv]


# ---------------------------------------------------------------- delay

def test_without_netem_no_delay_commands_are_emitted():
    cmds = plan_commands(plan_of(latency_ms=20.0), NetTopology("ab", 4), TC_QUEUE)
    assert not [c for c in cmds if "netem" in c.argv]


def test_uniform_delay_is_one_netem_per_switch_port():
    cmds = plan_commands(plan_of(latency_ms=20.0, rate_mbit=100.0), NetTopology("ab", 4), TC_NETEM)
    netem = [c for c in cmds if "netem" in c.argv]
    assert len(netem) == 4 and all(c.netns == "glab-sw" for c in netem)
    assert {args_after(c, "dev") for c in netem} == {"p0", "p1", "p2", "p3"}
    assert all(args_after(c, "delay") == "20ms" and "root" in c.argv for c in netem)
    # its queue holds what is in flight over the delay (at least the pfifo's 1000)
    assert int(args_after(netem[0], "limit")) > 1000


def test_per_link_delay_jitter_loss_is_a_tree_per_sender(tmp_path):
    plan = file_plan(tmp_path, {"link": [{"src": 1, "dst": 0, "latency_ms": 50, "jitter_ms": 5,
                                          "loss_pct": 1}]}, 3, latency_ms=10.0)
    cmds = in_ns(plan_commands(plan, NetTopology("ab", 3), TC_NETEM), "glab-sw")
    to_p0 = [c for c in cmds if "dev" in c.argv and args_after(c, "dev") == "p0"]
    netem = [c for c in to_p0 if "netem" in c.argv]
    assert len(netem) == 2
    slow = [c for c in netem if args_after(c, "delay") == "50ms"][0]
    assert slow.argv[slow.argv.index("delay") + 2] == "5ms" and args_after(slow, "loss") == "1%"
    srcs = {args_after(c, "src") for c in to_p0 if c.argv[1] == "filter"}
    assert srcs == {"198.18.0.2/32", "198.18.0.3/32"}
    to_p1 = [c for c in cmds if "netem" in c.argv and args_after(c, "dev") == "p1"]
    assert len(to_p1) == 1 and "root" in to_p1[0].argv


# ---------------------------------------------------------------- what cannot be done

def test_the_packet_line_replaces_the_bridge_only_where_it_has_work_now_or_later():
    line = Decision("tc", "packet-line", "t", caps(netem=False))
    rate_only, delayed = plan_of(), plan_of(latency_ms=5.0)
    bridged = lambda cmds: any(c.argv[:4] == ("ip", "link", "add", "br0") for c in cmds)  # noqa: E731
    carries = lambda plan, d, later=False: d.delay_mode.replaces_bridge(plan, later)  # noqa: E731
    assert not carries(rate_only, line) and carries(delayed, line)
    assert carries(rate_only, line, later=True)      # a scenario adds a latency
    assert not carries(delayed, TC_NETEM, later=True)
    assert bridged(plan_commands(rate_only, NetTopology("ab", 4), line))
    assert not bridged(plan_commands(rate_only, NetTopology("ab", 4), line, delayed_later=True))
    assert not bridged(plan_commands(delayed, NetTopology("ab", 4), line))


def test_jitter_and_loss_need_a_delay_mode_on_packets():
    line = Decision("tc", "packet-line", "t", caps(netem=False))
    for net in ({"jitter_ms": 2.0, "latency_ms": 5.0}, {"loss_pct": 1.0},
                {"reorder_pct": 1.0, "latency_ms": 5.0}, {"ge_p_pct": 1.0, "ge_r_pct": 20.0}):
        plan = plan_of(**net)
        with pytest.raises(CapabilityError, match="needs a delay mode that acts on packets"):
            plan_commands(plan, NetTopology("ab", 4), TC_QUEUE)
        with pytest.raises(CapabilityError):
            check_supported(plan, Decision("userspace", "release-queue", "t"))
        assert plan_commands(plan, NetTopology("ab", 4), TC_NETEM)
        assert plan_commands(plan, NetTopology("ab", 4), line)


def test_download_caps_need_ifb_and_mirred(tmp_path):
    plan = file_plan(tmp_path, {"worker": [{"id": 1, "down_mbit": 5}]})
    decision = Decision("tc", "netem", "t", caps(mirred=False))
    with pytest.raises(CapabilityError, match="mirred"):
        plan_commands(plan, NetTopology("ab", 3), decision)


def test_other_shapers_create_nothing():
    for shaper in ("userspace", "none"):
        assert plan_commands(plan_of(), NetTopology("ab", 4), Decision(shaper, "none", "t")) == []


def test_topology_and_plan_must_agree():
    with pytest.raises(ValueError, match="topology has 3 workers"):
        plan_commands(plan_of(workers=4), NetTopology("ab", 3), TC_QUEUE)


# ---------------------------------------------------------------- changing links in a run

def args_after_argv(argv, word):
    return argv[argv.index(word) + 1]


def _change(cmds):
    """The argv of ``tc class change`` commands, with their namespace."""
    return [(c.netns, c.argv) for c in cmds if c.argv[:3] == ("tc", "class", "change")]


def test_rate_change_is_a_class_change_of_the_egress_link_and_its_children():
    from netem.live import link_change_commands
    plan, topo = plan_of(workers=3, rate_mbit=20.0), NetTopology("ab", 3)
    cmds = link_change_commands(plan, topo, TC_QUEUE, 0, 1, rate_mbit=5.0)
    # the link class has 1077349 bit/s of room for the ACKs of
    # 1 -> 0's 20 Mbit/s on top of the link's 5 (ceil(20911602 * 78 / 1514))
    def burst(quantum: str) -> tuple:   # 1 ms of these rates is under two frames (3028 B)
        return ("burst", "3028b", "cburst", "3028b", "quantum", quantum)
    head = ("tc", "class", "change", "dev", "eth0")
    assert [(c.netns, c.argv) for c in cmds] == [
        # the slowest link of worker 0 went from 20 to 5 Mbit/s: GSO shrinks first
        ("glab-w0", ("ip", "link", "set", "dev", "eth0", "gso_max_segs", "4")),
        ("glab-w0", head + ("parent", "1:", "classid", "1:10", "htb", "rate", "6305250bit",
                            "ceil", "6305250bit") + burst("78815")),
        ("glab-w0", head + ("parent", "1:10", "classid", "1:11", "htb", "rate", "1077349bit",
                            "ceil", "6305250bit", "prio", "0") + burst("78815")),
        ("glab-w0", head + ("parent", "1:10", "classid", "1:12", "htb", "rate", "5227901bit",
                            "ceil", "5227901bit", "prio", "1") + burst("65348")),
        # the reverse link 1 -> 0 keeps its 20 Mbit/s, its room for 0 -> 1's ACKs now sized
        # for 5 Mbit/s (ceil(5227901 * 78 / 1514) = 269338 bit/s)
        ("glab-w1", head + ("parent", "1:", "classid", "1:10", "htb", "rate", "21180940bit",
                            "ceil", "21180940bit") + burst("200000")),
        ("glab-w1", head + ("parent", "1:10", "classid", "1:11", "htb", "rate", "269338bit",
                            "ceil", "21180940bit", "prio", "0") + burst("200000")),
        ("glab-w1", head + ("parent", "1:10", "classid", "1:12", "htb", "rate", "20911602bit",
                            "ceil", "20911602bit", "prio", "1") + burst("200000")),
        # the leaves' limit restated: what reopens a link after a cut
        ("glab-w0", ("tc", "qdisc", "change", "dev", "eth0", "parent", "1:11", "handle", "11:",
                     "pfifo", "limit", "1000")),
        ("glab-w0", ("tc", "qdisc", "change", "dev", "eth0", "parent", "1:12", "handle", "12:",
                     "pfifo", "limit", "1000")),
    ]
    assert htb_rate_bps(5.0, 1500) == 5227901       # the L2 correction of set-up
    # the link to worker 2 is the second flow of worker 0: classes 1:13..1:15
    to_2 = link_change_commands(plan, topo, TC_QUEUE, 0, 2, rate_mbit=5.0)
    assert [argv[argv.index("classid") + 1] for ns, argv in _change(to_2)
            if ns == "glab-w0"] == ["1:13", "1:14", "1:15"]


def test_a_change_restates_what_set_up_gives_the_same_rate_caps_and_ifb_included(tmp_path):
    """Changing 0->1 to 7 Mbit/s gives the classes set-up would have built for 7 Mbit/s, on
    worker 0's egress (under its uplink cap) and on worker 1's ifb (under its download cap)."""
    from netem.live import link_change_commands
    data = {"default": {"rate_mbit": 20},
            "worker": [{"id": 0, "up_mbit": 30}, {"id": 1, "down_mbit": 25}]}
    before, topo = file_plan(tmp_path, data), NetTopology("ab", 3)
    after = file_plan(tmp_path, data | {"link": [{"src": 0, "dst": 1, "rate_mbit": 7}]})
    # the forward link's classes (the reverse link's ACK room is checked above)
    changed = [(ns, argv) for ns, argv in
               _change(link_change_commands(before, topo, TC_QUEUE, 0, 1, rate_mbit=7.0))
               if (ns, args_after_argv(argv, "dev")) in (("glab-w0", "eth0"), ("glab-w1", "ifb0"))]
    setup = plan_commands(after, topo, TC_QUEUE)
    wanted = [(c.netns, ("tc", "class", "change") + c.argv[3:]) for c in setup
              if c.argv[:3] == ("tc", "class", "add")
              and (c.netns, args_after(c, "dev")) in (("glab-w0", "eth0"), ("glab-w1", "ifb0"))
              and args_after(c, "classid") in ("1:10", "1:11", "1:12")]
    assert len(wanted) == 6 and changed == wanted
    # link classes hang under the caps, as set-up put them
    assert {argv[argv.index("parent") + 1] for _, argv in changed[::3]} == {"1:1"}


def test_a_cut_closes_the_leaves_and_keeps_the_classes_and_gso_of_the_links_still_up():
    from netem.commands import CUT_LEAF_LIMIT_PKTS
    from netem.live import link_change_commands
    plan, topo = plan_of(workers=3, rate_mbit=20.0), NetTopology("ab", 3)
    cmds = link_change_commands(plan, topo, TC_QUEUE, 0, 1, rate_mbit=0)
    assert CUT_LEAF_LIMIT_PKTS == 0
    # no class change and no GSO command (0->2 is still the slowest link up, at 20 Mbit/s)
    assert [(c.netns, c.argv) for c in cmds] == [
        ("glab-w0", ("tc", "qdisc", "change", "dev", "eth0", "parent", f"1:{m}", "handle", f"{m}:",
                     "pfifo", "limit", "0")) for m in (11, 12)]
    assert all("cut" in c.desc for c in cmds)


def test_live_links_remember_what_is_in_force():
    from netem.live import LiveLinks
    plan, topo = plan_of(workers=3, rate_mbit=20.0), NetTopology("ab", 3)
    live = LiveLinks(plan, topo, TC_QUEUE)
    gso = [c.argv[-1] for c in live.change(0, 1, rate_mbit=5.0) if c.tool == "ip"]
    assert gso == ["4"] and live.rate_mbit(0, 1) == 5.0
    # 0->2 slows to 10: the slowest in force is still 0->1 at 5, so GSO stays
    assert not [c for c in live.change(0, 2, rate_mbit=10.0) if c.tool == "ip"]
    # 0->1 cut: the slowest link still up is 0->2 at 10 Mbit/s; GSO grows after the leaves close
    cmds = live.change(0, 1, rate_mbit=0)
    assert [c.argv[-1] for c in cmds] == ["0", "0", "8"]
    assert cmds[-1].argv == ("ip", "link", "set", "dev", "eth0", "gso_max_segs", "8")
    assert live.rate_mbit(0, 1) == 0.0 and live.effective_rate_mbit(0, 1) == 0.0
    # restore at 5: GSO shrinks first, then the classes change and the leaves reopen
    cmds = live.change(0, 1, rate_mbit=5.0)
    assert cmds[0].argv[-1] == "4" and [c.argv[-1] for c in cmds[-2:]] == ["1000", "1000"]
    assert [argv[argv.index("ceil") + 1] for ns, argv in _change(cmds) if ns == "glab-w0"] == \
        ["6305250bit", "6305250bit", "5227901bit"]
    assert live.rate_mbit(0, 1) == 5.0


def test_latency_without_netem_is_refused_naming_the_qdisc_and_the_release_queue():
    from netem.live import link_change_commands
    plan, topo = plan_of(workers=3, latency_ms=10.0), NetTopology("ab", 3)
    decision = Decision("tc", "release-queue", "t", caps(netem=False))
    with pytest.raises(CapabilityError, match=r"latency_ms = 30 on link 0->1 needs the netem "
                                              r"qdisc.*set_rx_link\(0"):
        link_change_commands(plan, topo, decision, 0, 1, latency_ms=30.0)
    # the latency in force (a restore restates it) is no change, so no error
    assert _change(link_change_commands(plan, topo, decision, 0, 1, rate_mbit=5.0,
                                        latency_ms=10.0))


def test_latency_change_is_a_netem_change_of_the_senders_qdisc(tmp_path):
    from netem.live import link_change_commands
    # 1->0 differs from 2->0, so set-up built one netem per sender towards worker 0
    plan = file_plan(tmp_path, {"default": {"rate_mbit": 20, "latency_ms": 10},
                                "link": [{"src": 2, "dst": 0, "latency_ms": 5}]})
    cmds = link_change_commands(plan, NetTopology("ab", 3), TC_NETEM, 1, 0, latency_ms=30.0)
    assert [(c.netns, c.argv) for c in cmds] == [
        ("glab-sw", ("tc", "qdisc", "change", "dev", "p0", "parent", "1:10", "handle", "10:",
                     "netem", "delay", "30ms", "limit", "2226"))]
    # a rate change alone restates the delay, with netem's limit for the new rate
    cmds = link_change_commands(plan, NetTopology("ab", 3), TC_NETEM, 2, 0, rate_mbit=40.0)
    assert cmds[-1].argv[-5:] == ("netem", "delay", "5ms", "limit", "1409")


def test_a_shared_netem_changes_only_where_it_has_one_sender():
    from netem.live import link_change_commands
    two = plan_of(workers=2, latency_ms=10.0, rate_mbit=20.0)
    cmds = link_change_commands(two, NetTopology("ab", 2), TC_NETEM, 0, 1, latency_ms=30.0)
    assert [c.argv for c in cmds] == [("tc", "qdisc", "change", "dev", "p1", "root", "netem",
                                       "delay", "30ms", "limit", "2226")]
    three = plan_of(workers=3, latency_ms=10.0)
    with pytest.raises(CapabilityError, match="shared by every sender to worker 1.*"
                                              "per_sender_delay=True"):
        link_change_commands(three, NetTopology("ab", 3), TC_NETEM, 0, 1, latency_ms=30.0)
    with pytest.raises(CapabilityError, match="set up without delay towards worker 1"):
        link_change_commands(plan_of(workers=3), NetTopology("ab", 3), TC_NETEM, 0, 1,
                             latency_ms=30.0)


def test_per_sender_delay_builds_a_netem_per_sender_that_a_change_can_reach():
    from netem.live import link_change_commands
    plan, topo = plan_of(workers=3), NetTopology("ab", 3)
    setup = plan_commands(plan, topo, TC_NETEM, per_sender_delay=True)
    netem = [c for c in setup if "netem" in c.argv]
    assert len(netem) == 6 and all(args_after(c, "delay") == "0ms" for c in netem)
    # nothing else differs from the default set-up (which has no delay at all here)
    assert plan_commands(plan, topo, TC_NETEM) == [c for c in setup if not (
        c.netns == "glab-sw" and c.tool == "tc")]
    cmds = link_change_commands(plan, topo, TC_NETEM, 2, 1, latency_ms=12.5,
                                per_sender_delay=True)
    assert [c.argv[4:10] for c in cmds] == [("p1", "parent", "1:13", "handle", "13:", "netem")]
    assert args_after(cmds[0], "delay") == "12.5ms"


@pytest.mark.parametrize("kwargs, message", [
    ({"rate_mbit": -1.0}, r"link 0->1 rate_mbit = -1.0 is out of range; expected a value in "
                          r"\[0, 100000\] \(0 cuts the link\)"),
    ({"rate_mbit": float("nan")}, "rate_mbit = nan is out of range"),
    ({"rate_mbit": float("inf")}, "rate_mbit = inf is out of range"),
    ({"rate_mbit": 2e5}, "rate_mbit = 200000.0 is out of range"),
    ({"rate_mbit": "5"}, "rate_mbit = '5' is not a number"),
    ({"rate_mbit": True}, "rate_mbit = True is not a number"),
    ({"latency_ms": -1.0}, r"link 0->1 latency_ms = -1.0 is out of range; expected a value in "
                           r"\[0, 10000\]"),
    ({"latency_ms": 1e6}, "latency_ms = 1000000.0 is out of range"),
    ({}, "link 0->1: nothing to change"),
])
def test_bad_change_values_are_refused_naming_the_value(kwargs, message):
    from netem.live import link_change_commands
    with pytest.raises(ValueError, match=message):
        link_change_commands(plan_of(workers=3), NetTopology("ab", 3), TC_NETEM, 0, 1, **kwargs)


def test_bad_links_and_shapers_are_refused():
    from netem.live import LiveLinks
    plan, topo = plan_of(workers=3), NetTopology("ab", 3)
    live = LiveLinks(plan, topo, TC_QUEUE)
    with pytest.raises(ValueError, match=r"worker 3 is out of range; this run has workers 0..2"):
        live.change(0, 3, rate_mbit=5.0)
    with pytest.raises(ValueError, match="link 1->1: src and dst are the same worker"):
        live.change(1, 1, rate_mbit=5.0)
    with pytest.raises(CapabilityError, match="shaper 'userspace'.*LinkShaper.set_link"):
        LiveLinks(plan, topo, Decision("userspace", "release-queue", "t"))
    with pytest.raises(ValueError, match="set up unshaped"):
        LiveLinks(plan_of("", workers=3), topo, TC_QUEUE)
    with pytest.raises(ValueError, match="topology has 4 workers, the plan 3"):
        LiveLinks(plan, NetTopology("ab", 4), TC_QUEUE)
    # a refused change leaves the values in force alone
    with pytest.raises(ValueError):
        live.change(0, 1, rate_mbit=5.0, latency_ms=-1.0)
    assert live.rate_mbit(0, 1) == 50.0


def test_host_tc_change_is_a_class_change_of_the_links_classes():
    from netem.hosttc import HostLink, HostShaping, change_commands, run_handle, setup_commands
    links = [HostLink(0, 1, "198.18.0.2", 30001, 8.0, "eth0"),
             HostLink(0, 2, "198.18.0.3", 30001, 8.0, "eth0"),
             HostLink(0, 3, "198.18.0.1", 30001, 8.0, "lo")]
    cmds = change_commands(links, 1500, 0x4abc, 0, 2, rate_mbit=5.0)
    burst = ("burst", "3028b", "cburst", "3028b", "quantum", "65348")   # two frames
    head = ("tc", "class", "change", "dev", "eth0")
    leaf = ("tc", "qdisc", "change", "dev", "eth0", "parent")
    assert [c.argv for c in cmds] == [
        head + ("parent", "4abc:", "classid", "4abc:13", "htb", "rate", "5227901bit", "ceil",
                "5227901bit") + burst,
        head + ("parent", "4abc:13", "classid", "4abc:14", "htb", "rate", "2613950bit", "ceil",
                "5227901bit", "prio", "0") + burst,
        head + ("parent", "4abc:13", "classid", "4abc:15", "htb", "rate", "2613951bit", "ceil",
                "5227901bit", "prio", "1") + burst,
        leaf + ("4abc:14", "handle", "14:", "pfifo", "limit", "1000"),
        leaf + ("4abc:15", "handle", "15:", "pfifo", "limit", "1000")]
    # the same arguments as set-up at that rate, on the same class ids
    again = setup_commands([links[0], HostLink(0, 2, "198.18.0.3", 30001, 5.0, "eth0")], 1500,
                           0x4abc)
    assert [c.argv[3:] for c in cmds[:3]] == [c.argv[3:] for c in again
                                              if c.argv[:3] == ("tc", "class", "add")][3:]
    cut = HostShaping("abc", links, 1500).change_commands(0, 3, 0)
    assert [c.argv for c in cut] == [
        ("tc", "qdisc", "change", "dev", "lo", "parent", f"{run_handle('abc'):x}:{m}", "handle",
         f"{m}:", "pfifo", "limit", "0") for m in (11, 12)]
    with pytest.raises(ValueError, match="link 2->0 does not leave this host"):
        change_commands(links, 1500, 0x4abc, 2, 0, rate_mbit=5.0)
    with pytest.raises(ValueError, match=r"rate_mbit = -5 is out of range"):
        change_commands(links, 1500, 0x4abc, 0, 1, rate_mbit=-5)
