"""The userspace shaper (no namespaces needed): loopback links paced to their rate and delayed
by their latency, measured by the same probe agents the tc shaper uses.

The probe's goodput cannot tell a shaper that releases early from one that does not: the
sender's backpressure alone paces the bulk data at the rate. That the receiver gets nothing
before the link could have carried it is test_zmq_transport.py's
test_the_userspace_shaper_delivers_its_rate_and_latency_on_the_receivers_clock."""
from __future__ import annotations


def test_userspace_shaper_rates_and_latency(scenario, tmp_path):
    profile = tmp_path / "p.toml"
    profile.write_text("[default]\nrate_mbit = 50\nlatency_ms = 10\n"
                       "[[link]]\nsrc = 0\ndst = 2\nrate_mbit = 5\n")
    res = scenario.run({"action": "probe", "workers": 3, "reexec": False, "shaper": "userspace",
                        "net": {"bw_profile": str(profile)}, "seconds": 1.5, "pings": 10})
    assert res["describe"]["mode"] == "loopback"
    rows = {(r["src"], r["dst"]): r for r in res["rows"]}
    assert rows[(0, 2)]["configured_mbit"] == 5 and rows[(2, 0)]["configured_mbit"] == 50
    for r in rows.values():
        assert 0.95 <= r["ratio"] <= 1.05, r
        assert abs(r["measured_latency_ms"] - 10.0) <= 2.0, r
