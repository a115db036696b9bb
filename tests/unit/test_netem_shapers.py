"""The shapers as objects: what a request becomes where tc can or cannot run, and what each
shaper says it does (the rest of the code asks these, never a name)."""
from __future__ import annotations

import pytest

from netem import delay as delay_modes
from netem import shapers
from netem.capabilities import Capabilities, CapabilityError, choose_shaper

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
        assert set(kind.delay_modes) <= set(delay_modes.MODES), kind
        packet = {m for m in kind.delay_modes if delay_modes.MODES[m].on_packets}
        assert bool(packet) == kind.kernel_classes, kind
    assert USERSPACE.paces_in_workers and not TC.paces_in_workers
    assert TC.namespaces and TC.launcher_changes_links and TC.ports_per_sender
    assert not (USERSPACE.namespaces or USERSPACE.launcher_changes_links
                or USERSPACE.ports_per_sender)


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
