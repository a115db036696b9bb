"""The shapers as objects: what a request becomes where tc can or cannot run, and what each
shaper says it does (the rest of the code asks these, never a name)."""
from __future__ import annotations

import pytest

from gasloc_emu.config import NetConfig
from netem import delay as delay_modes
from netem import shapers
from netem.capabilities import Capabilities, CapabilityError, Decision, choose_shaper
from netem.profiles import build_link_plan

TC, USERSPACE, NONE = (shapers.SHAPERS[n] for n in ("tc", "userspace", "none"))


@pytest.mark.parametrize("requested, missing, kind", [
    ("auto", "", TC), ("auto", "htb: unknown", USERSPACE), ("tc", "", TC),
    ("userspace", "", USERSPACE), ("userspace", "htb: unknown", USERSPACE),
    ("none", "", NONE), ("none", "htb: unknown", NONE)])
def test_a_request_resolves_to_one_shaper(requested, missing, kind):
    got, why = shapers.resolve(requested, missing)
    assert got is kind
    # auto says why it did not take tc; a request named outright needs no reason from the host
    assert (bool(missing) and missing in why) == (requested == "auto" and bool(missing))


def test_tc_where_it_cannot_run_is_refused_naming_where_and_why():
    with pytest.raises(shapers.ShaperError,
                       match="net.shaper = 'tc' is not possible on node 2: no CAP_NET_ADMIN; use"):
        shapers.resolve("tc", "no CAP_NET_ADMIN", "on node 2")


def test_an_unknown_request_names_the_allowed_ones():
    with pytest.raises(shapers.ShaperError, match="'netem' is not allowed; expected one of auto, "
                                                  "tc, userspace, none"):
        shapers.asked("netem")
    with pytest.raises(shapers.ShaperError, match="'htb' is unknown"):
        shapers.shaper("htb")


def test_only_none_turns_shaping_off():
    assert [r for r in shapers.REQUESTS if shapers.turned_off(r)] == ["none"]


def test_what_a_request_may_end_with():
    assert shapers.may_take("auto", TC) and shapers.may_take("auto", USERSPACE)
    assert not shapers.may_take("auto", NONE)
    assert shapers.may_take("tc", TC) and not shapers.may_take("userspace", TC)


def test_every_shaper_carries_known_delay_modes_and_only_tc_the_packet_ones():
    for kind in shapers.SHAPERS.values():
        assert isinstance(kind, shapers.Shaper)
        assert set(kind.delay_modes) <= set(delay_modes.MODES), kind
        packet = {m for m in kind.delay_modes if delay_modes.MODES[m].on_packets}
        assert bool(packet) == kind.worker_namespaces, kind


def test_what_each_shaper_does_is_its_methods():
    plan = build_link_plan(NetConfig(bw_profile="uniform", latency_ms=10.0), 3, 0)
    # the workers pace under userspace; under tc they hold only the release queue's latency
    spec = USERSPACE.worker_spec(plan, Decision("userspace", "release-queue", "t"))
    assert spec["mode"] == "userspace" and spec["links"][0][2] == 50.0
    spec = TC.worker_spec(plan, Decision("tc", "release-queue", "t"))
    assert spec["mode"] == "delay-only" and spec["links"][0][2] is None
    assert TC.worker_spec(plan, Decision("tc", "netem", "t")) is None
    assert NONE.worker_spec(plan, Decision("none", "none", "t")) is None
    # the launcher changes links under tc; the workers do under userspace
    assert TC.link_changer(object()) is not None
    assert USERSPACE.link_changer(object()) is None and NONE.link_changer(object()) is None
    # across hosts only tc's part binds a port per sender and refuses a scenario's changes
    part = USERSPACE.on_host(plan, [0, 1], {}, 1500)
    assert not part.ports_per_sender and part.describe() is None
    part.change_links({(0, 1): (5.0, None)})


def _caps(**features) -> Capabilities:
    base = {f: True for f in ("veth", "bridge", "htb", "pfifo", "u32")}
    return Capabilities(root=True, in_userns=False, userns=True, tools=("ip", "tc", "unshare"),
                        probed_with="unshare -Urn", features=base | features)


def test_the_decision_carries_the_shaper_object():
    d = choose_shaper("auto", _caps(htb=False))
    assert d.shaper_kind is USERSPACE and d.delay == "release-queue"
    assert "using the userspace shaper" in d.reason and "latency not seen by TCP" in d.reason
    assert choose_shaper("none", _caps()).shaper_kind is NONE


def test_a_shaper_with_one_delay_mode_refuses_another():
    with pytest.raises(CapabilityError, match="net.delay = 'netem' needs the tc shaper's "
                                              "namespaces, and this run has the userspace"):
        choose_shaper("userspace", _caps(netem=True), delay="netem")


@pytest.mark.parametrize("requested, why", [
    ("nosuch_module:X", "did not load: ModuleNotFoundError"),
    ("netem.userspace:LinkShaper", "not a subclass of netem.shapers.Shaper"),
    ("netem.shaper_tc:TcShaper", "calls itself 'tc', a built-in's name"),
    ("deep-queue", "is not allowed; expected one of auto, tc, userspace, none")])
def test_a_plugin_that_is_no_shaper_is_refused_with_the_config(requested, why):
    from gasloc_emu.config import ConfigError
    with pytest.raises(ConfigError, match=f"net.shaper = '{requested}'.*{why}"):
        NetConfig(shaper=requested)



def test_a_shaper_by_path_decides_under_its_own_name(monkeypatch):
    class Quiet(type(USERSPACE)):
        name = "quiet"
    monkeypatch.setattr(shapers, "_LOADED", dict(shapers._LOADED))
    monkeypatch.setitem(globals(), "Quiet", Quiet)
    d = choose_shaper(f"{__name__}:Quiet", _caps())
    assert d.shaper == "quiet" and isinstance(d.shaper_kind, Quiet)
    assert d.reason.startswith("quiet shaper requested")
