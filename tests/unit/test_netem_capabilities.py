"""Shaper choice from detected capabilities (synthetic here; tests/net probes the real kernel)."""
from __future__ import annotations

import json

import pytest

from netem.capabilities import FEATURES, Capabilities, CapabilityError, _parse_probe, choose_shaper

ALL = {f: True for f in FEATURES}


def caps(root=False, userns=True, in_userns=False, tools=("ip", "tc", "unshare", "mount"),
         **features):
    return Capabilities(root=root, in_userns=in_userns, userns=userns, tools=tools,
                        probed_with="unshare -Urn", features=ALL | features,
                        errors={f: f"{f} is unknown" for f, ok in features.items() if not ok})


def test_parse_probe_output():
    out = "ok veth\nfail netem Error: Specified qdisc kind is unknown.\nok htb\nnoise\nok nosuch\n"
    features, errors = _parse_probe(out)
    assert features == {"veth": True, "netem": False, "htb": True}
    assert errors == {"netem": "Error: Specified qdisc kind is unknown."}


def test_auto_prefers_tc_with_netem_when_present():
    d = choose_shaper("auto", caps())
    assert (d.shaper, d.delay) == ("tc", "netem")


def test_auto_uses_the_packet_line_without_netem():
    d = choose_shaper("auto", caps(netem=False))
    assert (d.shaper, d.delay) == ("tc", "packet-line")
    assert d.delay_mode.faithful_to_tcp and "packet delay line" in d.reason


def test_auto_uses_the_release_queue_without_netem_or_packet_sockets_and_says_so():
    d = choose_shaper("auto", caps(netem=False, packet=False))
    assert (d.shaper, d.delay) == ("tc", "release-queue")
    assert "netem needs netem: netem is unknown" in d.reason
    assert "packet-line needs packet: packet is unknown" in d.reason
    assert not d.delay_mode.faithful_to_tcp and d.as_dict()["delay_faithful_to_tcp"] is False
    assert "not faithful to TCP" in d.reason


def test_a_delay_mode_on_request_is_used_or_refused_in_one_line():
    assert choose_shaper("tc", caps(), delay="packet-line").delay == "packet-line"
    assert choose_shaper("auto", caps(), delay="release-queue").delay == "release-queue"
    with pytest.raises(CapabilityError, match="net.delay = 'netem' is not possible here: netem "
                                              "needs netem: netem is unknown"):
        choose_shaper("tc", caps(netem=False), delay="netem")
    with pytest.raises(CapabilityError, match="net.delay = 'fast' is not allowed"):
        choose_shaper("tc", caps(), delay="fast")
    with pytest.raises(CapabilityError, match="needs the tc shaper's namespaces"):
        choose_shaper("userspace", caps(), delay="packet-line")


def test_auto_falls_back_to_userspace_and_says_why():
    d = choose_shaper("auto", caps(userns=False))
    assert (d.shaper, d.delay) == ("userspace", "release-queue")
    assert "user namespaces are disabled and this process is not root" in d.reason
    d = choose_shaper("auto", caps(htb=False))
    assert d.shaper == "userspace" and "htb: htb is unknown" in d.reason
    d = choose_shaper("auto", caps(tools=("unshare",)))
    assert d.shaper == "userspace" and "iproute2" in d.reason


def test_root_or_an_existing_user_namespace_is_enough_for_tc():
    assert choose_shaper("auto", caps(userns=False, root=True)).shaper == "tc"
    assert choose_shaper("auto", caps(userns=False, in_userns=True)).shaper == "tc"


def test_tc_on_request_fails_where_impossible():
    with pytest.raises(CapabilityError, match="net.shaper = 'tc' is not possible here: u32"):
        choose_shaper("tc", caps(u32=False))
    assert choose_shaper("tc", caps()).shaper == "tc"


def test_userspace_and_none_on_request():
    assert choose_shaper("userspace", caps()).shaper == "userspace"
    d = choose_shaper("none", caps())
    assert (d.shaper, d.delay) == ("none", "none")


def test_unknown_shaper():
    with pytest.raises(CapabilityError, match="net.shaper = 'fast' is not allowed"):
        choose_shaper("fast", caps())


def test_features_read_as_flags_and_serialise():
    c = caps(netem=False)
    assert c.htb and not c.netem and c.has("mirred")
    with pytest.raises(AttributeError):
        _ = c.nosuch
    back = json.loads(json.dumps(choose_shaper("auto", c).as_dict()))
    assert back["capabilities"]["features"]["netem"] is False
