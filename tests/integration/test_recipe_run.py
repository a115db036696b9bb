"""run equals simulate to the bit with the inner recipe on: an lr schedule on each worker's step
counter and gradient accumulation (2 tiny workers, a few rounds)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

ARGS = ["--workers", "2", "--model", "tiny", "--local-steps", "2", "--rounds", "3", "--seed", "1",
        "--algo", "diloco", "--no-dashboard", "--lr-schedule", "cosine", "--warmup-steps", "2",
        "--micro-batches", "2", "--set", "data.max_corpus_mb=0.25",
        "--set", "data.eval_batches=1", "--set", "data.batch_size=2"]


def _rows(out) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["round"], r["worker"]))


def test_run_matches_simulate_with_a_schedule_and_accumulation(tmp_path):
    for mode in ("run", "simulate"):
        done = subprocess.run([sys.executable, "-m", "gasloc_emu", mode, *ARGS, "--out",
                               str(tmp_path / mode)], capture_output=True, text=True,
                              timeout=240)
        assert done.returncode == 0, done.stderr
    ran, sim = _rows(tmp_path / "run"), _rows(tmp_path / "simulate")
    assert [(r["round"], r["worker"]) for r in ran] == [(r["round"], r["worker"]) for r in sim]
    for a, b in zip(ran, sim, strict=True):
        assert a["train_loss"] == b["train_loss"] and a["lr"] == b["lr"]
        assert a["tokens"] == b["tokens"] == 2 * 2 * 2 * 64   # steps * micro * batch * context
    # the schedule moved: warmup to the full lr by step 2 (index 1), then cosine over steps 2..6;
    # the last step (index 5) is 3/4 of the way down
    lrs = [r["lr"] for r in sim if r["worker"] == 0]
    assert lrs[0] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(0.75 * math.pi))))
