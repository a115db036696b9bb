"""runs/mtbf.toml is the grid its results section (docs/RESULTS.md, "Random crashes against
MTBF") says it is: GASLoC, DiLoCo and DSGD at no faults and an MTBF of 24 h, 8 h and 2 h per
worker, and GASLoC restarting from checkpoints at 8 h and 2 h, with each MTBF the scenario's
``mtbf_s`` on the stated time scale (one round of compute, 0.5 s of the run's clock, is 10 min).
"""
from __future__ import annotations

from pathlib import Path

from gasloc_emu.experiments.spec import arm_config, load_spec
from gasloc_emu.scenario.load import load_scenario

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "runs" / "mtbf.toml"
REAL_S_PER_CLOCK_S = 10 * 60 / 0.5   # a 0.5 s round of compute stands for 10 min
HOURS = {"24h": 24.0, "8h": 8.0, "2h": 2.0}


def test_the_preset_is_the_grid_and_the_time_scale_the_section_states():
    spec = load_spec(PRESET)
    grid = {}
    for arm in spec.arms:
        cfg = arm_config(PRESET, arm, spec.seeds[0])
        assert cfg.algo.local_steps * cfg.compute.step_time_s == (
            0.05 if cfg.algo.name == "dsgd" else 0.5)
        assert cfg.algo.local_steps * cfg.run.rounds == 200   # equal inner steps
        assert (cfg.net.bw_profile, cfg.net.placement, cfg.workers) == ("cloud", "aws8", 8)
        mtbf = "none"
        if cfg.run.scenario:
            scenario = load_scenario(str(REPO / cfg.run.scenario), cfg.workers, cfg.run.rounds)
            (source,) = scenario.faults.spec.sources
            assert source.kind == "crash" and source.distribution == "exponential"
            mtbf = next(k for k, h in HOURS.items()
                        if abs(source.mtbf_s * REAL_S_PER_CLOCK_S - h * 3600) < 1e-6)
            assert (source.restart_from == "checkpoint") == (cfg.run.checkpoint_every > 0)
            mtbf += "-ckpt" if source.restart_from == "checkpoint" else ""
        grid[arm.name] = (cfg.algo.name, mtbf)
    assert grid == {f"{algo}-{m}": (algo, m) for algo in ("gasloc", "diloco", "dsgd")
                    for m in ("none", *HOURS)} | {
        "gasloc-ckpt-8h": ("gasloc", "8h-ckpt"), "gasloc-ckpt-2h": ("gasloc", "2h-ckpt")}
