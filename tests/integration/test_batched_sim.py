"""The batched simulator (``sim.batched = true``) against the per-worker one, its reference:
the same run to float rounding, for every built-in algorithm with rounds; what it cannot do is
refused before anything runs."""
from __future__ import annotations

import json

import pytest

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate
from gasloc_emu.training.data import build_corpus

pytestmark = pytest.mark.integration

BASE = {"model.preset": "tiny", "workers": 4, "seed": 3, "run.dashboard": "off",
        "run.rounds": 3, "data.eval_batches": 2, "data.max_corpus_mb": 1.0}


@pytest.fixture(scope="module")
def corpus():
    return build_corpus(C.resolve(overrides=BASE))


def _both(tmp_path, corpus, **dotted) -> tuple[dict, dict, list, list]:
    out = []
    for batched in (False, True):
        cfg = C.resolve(overrides=BASE | dotted | {"sim.batched": batched})
        where = tmp_path / f"b{int(batched)}"
        summary = simulate(build_plan(cfg, corpus=corpus), where)
        rows = [json.loads(line) for line in (where / "metrics.jsonl").read_text().splitlines()]
        out.append((summary, sorted(rows, key=lambda r: (r["round"], r["worker"]))))
    (ref, ref_rows), (got, got_rows) = out
    return ref, got, ref_rows, got_rows


@pytest.mark.parametrize("algo, extra", [
    ("gasloc", {"algo.local_steps": (2, 3, 4, 5)}),    # uneven H_i: rows step apart
    ("diloco", {"algo.local_steps": 4}),
    ("diloco", {"algo.local_steps": 4, "algo.inner.schedule": "cosine",   # each row's own lr
                "algo.inner.warmup_steps": 3}),
    ("dsgd", {"run.rounds": 8}),
    ("local-gossip", {"algo.local_steps": 3, "topology.name": "ring"}),
])
def test_batched_equals_per_worker_to_float_rounding(tmp_path, corpus, algo, extra):
    ref, got, ref_rows, got_rows = _both(tmp_path, corpus, **{"algo.name": algo, **extra})
    assert got["final_eval_loss"] == pytest.approx(ref["final_eval_loss"], rel=1e-4)
    assert [r["steps"] for r in got_rows] == [r["steps"] for r in ref_rows]
    for a, b in zip(ref_rows, got_rows, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
    assert got["status"] == "ok" and got["bytes_sent_total"] == ref["bytes_sent_total"]
    assert got["predicted_wall_s"] is None  # batched steps measured here predict no wall time


def test_a_nominal_budget_steps_each_worker_as_the_reference_does(tmp_path, corpus):
    """Under a budget of nominal step times a straggler takes fewer steps; the batched rows
    stop with it, and the virtual clock predicts the same wall time."""
    ref, got, ref_rows, got_rows = _both(
        tmp_path, corpus, **{"compute.step_time_s": 0.01, "compute.inner_budget_s": 0.05,
                             "compute.profile": "straggler", "compute.slow_speed": 0.5})
    assert [r["steps"] for r in got_rows] == [r["steps"] for r in ref_rows]
    assert {r["steps"] for r in got_rows} == {5, 2}
    assert got["predicted_wall_s"] == pytest.approx(ref["predicted_wall_s"], rel=1e-9)
    assert got["final_eval_loss"] == pytest.approx(ref["final_eval_loss"], rel=1e-4)


@pytest.mark.parametrize("dotted, why", [
    ({"algo.name": "a2cid2"}, "has no rounds"),
    ({"fault.worker": 1}, "injected fault"),
    ({"compute.inner_budget_s": 1.0}, "measured step times"),
])
def test_what_it_cannot_batch_is_refused_with_the_reason(dotted, why):
    cfg = C.resolve(overrides=BASE | dotted | {"sim.batched": True})
    with pytest.raises(C.ConfigError, match=why):
        build_plan(cfg, data=False)
