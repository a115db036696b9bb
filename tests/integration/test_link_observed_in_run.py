"""A link trace's changes reach the running userspace shaper and are measured: summary.json's
``link_changes`` has each change with the rate its link delivered afterwards."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

TRACE = "time_s,src,dst,rate_mbit\n0.0,0,1,50\n0.0,1,0,50\n0.5,0,1,2\n0.5,1,0,2\n"
SLOW_MBIT = 2.0


def cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_a_slowed_link_is_observed_at_its_new_rate(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(TRACE)
    res = cli("run", "--workers", "2", "--model", "tiny", "--local-steps", "2", "--rounds", "4",
              "--step-time-s", "0.1", "--no-dashboard", "--set", "data.max_corpus_mb=0.5",
              "--set", "data.eval_batches=1", "--link-trace", str(trace),
              "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    changes = json.loads((tmp_path / "run" / "summary.json").read_text())["link_changes"]
    assert [(c["src"], c["dst"], c["round"], c["at_s"], c["rate_mbit"]) for c in changes] == [
        (0, 1, None, 0.0, 50.0), (1, 0, None, 0.0, 50.0),
        (0, 1, None, 0.5, 2.0), (1, 0, None, 0.5, 2.0)]
    slowed = [c["observed_mbit"] for c in changes[2:]]
    print("observed_mbit after the slowdown:", slowed, "rounds:",
          [c["observed_round"] for c in changes[2:]])
    assert all(c["observed_round"] is not None for c in changes[2:]), changes
    assert all(abs(mbit - SLOW_MBIT) <= 0.05 * SLOW_MBIT for mbit in slowed), changes
