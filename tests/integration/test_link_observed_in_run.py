"""A scenario's link change reaches the running userspace shaper at its round and is measured:
summary.json's ``link_changes`` has it with the rate its link delivered afterwards (the same
for changes by time: tests/integration/test_scenario_links.py replays a trace; under tc:
tests/net/test_run_shaped.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

SCENARIO = "[[event]]\ntype = 'link'\nround = 2\nlinks = [[0, 1], [1, 0]]\nrate_mbit = 2.0\n"
SLOW_MBIT = 2.0


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_a_slowed_link_is_observed_at_its_new_rate(tmp_path):
    scenario = tmp_path / "slow.toml"
    scenario.write_text(SCENARIO)
    res = cli("run", "--workers", "2", "--model", "tiny", "--local-steps", "2", "--rounds", "5",
              "--step-time-s", "0.1", "--no-dashboard", "--set", "data.max_corpus_mb=0.5",
              "--set", "data.eval_batches=1", "--scenario", str(scenario),
              "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["shaper"] == "userspace"   # no profile: the scenario's links need one
    changes = summary["link_changes"]
    assert [(c["src"], c["dst"], c["round"], c["at_s"], c["rate_mbit"]) for c in changes] == [
        (0, 1, 2, None, 2.0), (1, 0, 2, None, 2.0)]
    for c in changes:
        assert c["observed_round"] == 2 and len(c["observed_each_mbit"]) == 3, c
        assert abs(c["observed_mbit"] - SLOW_MBIT) <= 0.05 * SLOW_MBIT, c
