"""The real probe: it runs in a scratch namespace, changes nothing on the host, and is cached."""
from __future__ import annotations

import subprocess

from netem import capabilities as C


def _host() -> tuple[str, str]:
    def run(*a: str) -> str:
        return subprocess.run(a, capture_output=True, text=True, timeout=10).stdout

    return run("ip", "-o", "link"), run("tc", "qdisc", "show")


def test_probe_detects_in_a_scratch_namespace_and_is_cached(tc_caps):
    before = _host()
    C.probe.cache_clear()
    caps = C.probe()
    assert _host() == before
    assert C.probe() is caps
    assert caps.probed_with.startswith("unshare")
    # every feature was actually tried: a verdict for each, an error for each one missing
    assert set(caps.features) == set(C.FEATURES)
    assert all(caps.errors.get(f) for f, ok in caps.features.items() if not ok)
    decision = C.choose_shaper("auto", caps)
    assert decision.shaper == "tc"
    assert decision.delay == ("netem" if caps.has("netem") else
                              "packet-line" if caps.has("packet") else "release-queue")
