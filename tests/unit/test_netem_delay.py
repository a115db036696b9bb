"""Delay modes as objects: what each applies, the choice, and the impairments a plan may ask."""
from __future__ import annotations

import pytest

from gasloc_emu.config import DELAY_MODES, JITTER_DISTS, NetConfig
from netem import delay
from netem.capabilities import Decision
from netem.commands import NetTopology, netem_args, plan_commands
from netem.profiles import JITTER_DISTS as PROFILE_DISTS
from netem.profiles import Link, ProfileError, build_link_plan
from tests.unit.test_netem_capabilities import caps


def test_the_config_takes_the_registrys_names_not_a_copy():
    assert DELAY_MODES is delay.REQUESTS and JITTER_DISTS is PROFILE_DISTS


def test_only_the_release_queue_is_not_faithful_to_tcp():
    assert {m.name for m in delay.MODES.values() if not m.faithful_to_tcp} == {"release-queue"}
    assert delay.mode("release-queue").applies == {"latency_ms"}
    with pytest.raises(delay.DelayModeError, match="'fast' is unknown; expected one of"):
        delay.mode("fast")


@pytest.mark.parametrize("link, words", [
    ({"latency_ms": -1}, r"latency_ms = -1 is out of range; expected a value in \[0, 10000\]"),
    ({"loss_pct": 100}, r"loss_pct = 100 is out of range; expected a value in \[0, 100\)"),
    ({"jitter_ms": 6, "latency_ms": 5}, r"jitter_ms = 6 is out of range; expected a value in "
                                        r"\[0, 5\] .* set reorder_pct > 0"),
    ({"jitter_dist": "cauchy"}, "jitter_dist = 'cauchy' is not allowed"),
    ({"ge_p_pct": 1}, r"ge_r_pct = 0 is out of range with ge_p_pct = 1"),
    ({"queue_pkts": 0}, r"queue_pkts = 0 is out of range; expected an integer in \[1, "),
])
def test_bad_impairments_name_the_value_and_the_range(link, words):
    with pytest.raises(ProfileError, match=words):
        Link(0, 1, 10.0, **link)


def test_jitter_beyond_the_delay_is_allowed_with_reordering():
    assert Link(0, 1, 10.0, latency_ms=5, jitter_ms=8, reorder_pct=1).jitter_ms == 8


def test_mean_loss_of_random_and_bursty_loss():
    assert Link(0, 1, 1.0, loss_pct=1).mean_loss_pct() == pytest.approx(1.0)
    # stationary share of the bad state p / (p + r) = 1 / 26, all lost there
    ge = Link(0, 1, 1.0, ge_p_pct=1, ge_r_pct=25)
    assert ge.mean_loss_pct() == pytest.approx(100 / 26)


def test_netem_arguments_carry_every_impairment():
    link = Link(0, 1, 10.0, latency_ms=50, jitter_ms=5, jitter_dist="pareto", reorder_pct=2,
                ge_p_pct=1, ge_r_pct=30, ge_bad_loss_pct=80)
    args = netem_args(link, 10_000_000, 1500)
    assert args[:9] == ["delay", "50ms", "5ms", "distribution", "pareto", "reorder", "2%",
                        "loss", "gemodel"]
    assert args[9:12] == ["1%", "30%", "80%"]


def test_the_packet_line_replaces_the_bridge_and_emits_no_netem():
    plan = build_link_plan(NetConfig(bw_profile="uniform", latency_ms=20, loss_pct=1), 3, 0)
    cmds = plan_commands(plan, NetTopology("ab", 3), Decision("tc", "packet-line", "t",
                                                              caps(netem=False)))
    text = [str(c) for c in cmds]
    assert not any("bridge" in c or "master" in c or "netem" in c for c in text)
    assert sum("promisc on up" in c for c in text) == 3
    bridged = [str(c) for c in plan_commands(plan, NetTopology("ab", 3),
                                             Decision("tc", "netem", "t", caps()))]
    assert any("type bridge" in c for c in bridged) and any("netem" in c for c in bridged)


def test_the_bottleneck_queue_is_the_bulk_leaf():
    plan = build_link_plan(NetConfig(bw_profile="uniform", queue_pkts=64), 2, 0)
    cmds = [c.argv for c in plan_commands(plan, NetTopology("ab", 2),
                                          Decision("tc", "netem", "t", caps()))
            if "pfifo" in c.argv]
    assert sorted(a[-1] for a in cmds) == ["1000", "1000", "64", "64"]  # ACK leaves keep 1000


def test_auto_prefers_netem_then_the_line_then_the_release_queue():
    assert delay.choose("auto", caps())[0].name == "netem"
    assert delay.choose("auto", caps(netem=False))[0].name == "packet-line"
    m, why = delay.choose("auto", caps(netem=False, packet=False))
    assert m.name == "release-queue" and "not faithful to TCP" in why


class _Live:
    """A LiveLinks stand-in that records what a mode asks of it."""

    def __init__(self):
        self.asked = []

    def change(self, src, dst, **values):
        self.asked.append((src, dst, values))
        return [f"tc {src}->{dst}"]


class _Session:
    runs_line = True

    def __init__(self):
        self.latencies = {}

    def set_line_latency(self, src, dst, latency_ms):
        self.latencies[(src, dst)] = latency_ms


@pytest.mark.parametrize("name, qdisc_latency, line_latency", [
    ("netem", 30.0, None), ("packet-line", None, 30.0), ("release-queue", None, None)])
def test_each_mode_puts_a_changed_latency_where_it_holds_latency(name, qdisc_latency,
                                                                  line_latency):
    live, session = _Live(), _Session()
    cmds = delay.mode(name).change_link(session, live, 0, 1, 8.0, 30.0)
    assert cmds == ["tc 0->1"]                      # the rate always goes to tc
    assert live.asked == [(0, 1, {"rate_mbit": 8.0} | (
        {"latency_ms": qdisc_latency} if qdisc_latency is not None else {}))]
    assert session.latencies.get((0, 1)) == line_latency


def test_only_the_release_queue_has_the_workers_hold_latency_and_only_with_latency():
    delayed = build_link_plan(NetConfig(bw_profile="uniform", latency_ms=20), 3, 0)
    rate_only = build_link_plan(NetConfig(bw_profile="uniform"), 3, 0)
    specs = {name: delay.mode(name).worker_spec(delayed) for name in delay.MODES}
    assert [n for n, spec in specs.items() if spec is not None] == ["release-queue"]
    assert specs["release-queue"]["mode"] == "delay-only"
    assert delay.mode("release-queue").worker_spec(rate_only) is None


def test_only_netem_puts_qdiscs_on_the_ports_and_only_the_line_replaces_the_bridge():
    plan = build_link_plan(NetConfig(bw_profile="uniform", latency_ms=20), 3, 0)
    topo = NetTopology("ab", 3)
    ports = {n: delay.mode(n).port_commands(plan, topo, 0, False) for n in delay.MODES}
    assert [n for n, c in ports.items() if c] == ["netem"]
    assert all("netem" in c.argv for c in ports["netem"])
    assert [n for n in delay.MODES if delay.mode(n).replaces_bridge(plan, False)] == [
        "packet-line"]
    assert [n for n in delay.MODES if delay.mode(n).across_hosts] == ["release-queue"]
