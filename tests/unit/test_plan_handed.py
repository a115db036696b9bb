"""The run plan is built once, by the launcher, and handed to its workers serialised
(``plan.handed`` through the zygote, ``plan.received`` in each worker): what a worker reads
back is the launcher's plan, with a scenario's world, a topology and TCP-aware link models,
and a plan of another run is refused."""
from __future__ import annotations

import pytest

from gasloc_emu import config as C
from gasloc_emu.plan import PlanError, build_plan, handed, received

SCENARIO = """
[[event]]
type = "leave"
round = 1
worker = 3

[[event]]
type = "link"
round = 2
link = [0, 1]
rate_mbit = 5.0
"""


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO)
    return C.resolve(overrides={
        "workers": 6, "run.rounds": 4, "topology.name": "expander", "topology.degree": 3,
        "net.bw_profile": "skewed", "net.latency_ms": 40.0, "net.delay": "packet-line",
        "run.scenario": str(path), "net.probe": False})


def test_a_worker_reads_back_the_launchers_plan(cfg):
    plan = build_plan(cfg)
    got = received(handed(plan), cfg)
    assert got.describe() == plan.describe()
    assert got.topology == plan.topology and got.algorithm == plan.algorithm
    for t in range(4):   # the world and the links' models behave as the launcher's
        assert got.world.alive(t) == plan.world.alive(t)
        assert [got.world.plan(r, t) for r in range(6)] == \
            [plan.world.plan(r, t) for r in range(6)]
        for src, dst in ((0, 1), (2, 5)):
            assert got.link_model(src, dst, 1 << 20) == plan.link_model(src, dst, 1 << 20)
    # the corpus is opened by the worker, not carried: the same tokens
    assert (got.corpus.shard(2).tokens == plan.corpus.shard(2).tokens).all()


def test_the_bytes_carry_no_corpus(cfg):
    plan = build_plan(cfg)
    assert len(handed(plan)) < len(handed(build_plan(cfg, data=False))) + 4096


def test_a_plan_of_another_run_is_refused(cfg):
    blob = handed(build_plan(cfg, data=False))
    other = C.replace(cfg, seed=cfg.seed + 1)
    with pytest.raises(PlanError, match="not this run's"):
        received(blob, other)
