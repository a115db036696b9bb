"""The engines that make an experiment's runs: the registry, the settings each reads, and what
submitit's Slurm executor is asked for (its parameters and the sbatch script it would submit),
read without a Slurm cluster: nothing here submits or runs anything."""
from __future__ import annotations

import shutil

import pytest
import submitit  # the test extra has it: missing is an error, not a skip
from click.testing import CliRunner

from gasloc_emu import config as C
from gasloc_emu.commands import cli
from gasloc_emu.experiments import engines


def test_the_config_offers_the_registrys_engines():
    assert tuple(engines.ENGINES) == C.ENGINES
    assert set(C.EngineConfig.__dataclass_fields__) - {"name"} == \
        set().union(*(e.settings for e in engines.ENGINES.values()))


def test_the_slurm_executor_gets_the_requested_parameters(tmp_path, monkeypatch):
    """This machine has no srun, and submitit's SlurmExecutor refuses to be built without one
    (its affinity check): the check alone is told there is one. The parameters are submitit's
    own translation of ours, and the script is the one its array submission hands to sbatch."""
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    cfg = C.resolve_engine({"engine.name": "submitit", "engine.cluster": "slurm",
                            "engine.partition": "gpu", "engine.time_limit_min": 90,
                            "engine.cpus_per_task": 4, "engine.gpus_per_task": 1,
                            "engine.mem_gb": 8.0, "engine.array_parallelism": 2})
    engine = engines.make_engine(cfg, tmp_path)
    slurm = engine.executor._executor
    assert isinstance(slurm, submitit.SlurmExecutor)
    assert slurm.folder == (tmp_path / "engine-logs").absolute()
    assert {k: slurm.parameters.get(k) for k in ("partition", "time", "cpus_per_task",
                                                 "gpus_per_node", "mem", "array_parallelism",
                                                 "job_name")} == {
        "partition": "gpu", "time": 90, "cpus_per_task": 4, "gpus_per_node": 1, "mem": "8GB",
        "array_parallelism": 2, "job_name": "gasloc-emu"}
    from submitit.slurm.slurm import _make_sbatch_string
    script = _make_sbatch_string(command=slurm._submitit_command_str, folder=slurm.folder,
                                 **slurm.parameters | {"map_count": 3})
    lines = set(script.splitlines())
    assert {"#SBATCH --array=0-2%2", "#SBATCH --partition=gpu", "#SBATCH --time=90",
            "#SBATCH --cpus-per-task=4", "#SBATCH --gpus-per-node=1", "#SBATCH --mem=8GB",
            "#SBATCH --job-name=gasloc-emu"} <= lines, script
    assert f"#SBATCH --error={slurm.folder}/%A_%a_0_log.err" in lines


def test_the_default_slurm_job_asks_for_no_partition_or_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    engine = engines.make_engine(C.resolve_engine({"engine.name": "submitit"}), tmp_path)
    params = engine.executor._executor.parameters
    assert "partition" not in params and "mem" not in params and "gpus_per_node" not in params
    assert params["time"] == 60 and params["cpus_per_task"] == 1


@pytest.mark.skipif(shutil.which("srun") is not None, reason="this machine is a Slurm node")
def test_slurm_without_srun_is_bad_input_naming_the_setting(tmp_path):
    with pytest.raises(C.ConfigError, match=r"engine.cluster = 'slurm': .*srun.*--cluster local"):
        engines.make_engine(C.resolve_engine({"engine.name": "submitit"}), tmp_path)


@pytest.mark.parametrize("key, value", [("engine.partition", "gpu"),
                                        ("engine.cpus_per_task", 4),
                                        ("engine.cluster", "local")])
def test_a_setting_the_chosen_engine_does_not_read_is_refused(tmp_path, key, value):
    with pytest.raises(C.ConfigError, match=rf"{key} = .* is not read by engine.name = 'local'"):
        engines.make_engine(C.resolve_engine({key: value}), tmp_path)
    assert isinstance(engines.make_engine(C.resolve_engine({}), tmp_path), engines.LocalEngine)


class _Job:
    """A job of which only waiting is asked: it is interrupted (Ctrl-C) or ends well."""

    def __init__(self, interrupted: bool):
        self.interrupted, self.cancelled = interrupted, False

    def exception(self):
        if self.interrupted:
            raise KeyboardInterrupt
        return None

    def cancel(self, check: bool = True):
        self.cancelled = True


def test_an_interrupt_while_waiting_cancels_every_job(tmp_path):
    jobs = [_Job(False), _Job(True), _Job(False)]
    points = [engines.Point(C.Config(), tmp_path / str(k), "simulate") for k in range(3)]
    with pytest.raises(KeyboardInterrupt):
        engines.wait_for(points, jobs)
    assert [j.cancelled for j in jobs] == [True, True, True]
    assert engines.wait_for(points, [_Job(False)] * 3) == []


def test_engine_settings_are_checked_like_any_setting():
    with pytest.raises(C.ConfigError, match=r"engine.time_limit_min = 0 is out of range"):
        C.resolve_engine({"engine.time_limit_min": 0})
    with pytest.raises(C.ConfigError, match="engine.name = 'ray' is not allowed"):
        C.resolve_engine({"engine.name": "ray"})


@pytest.mark.parametrize("cmd", ["sweep", "crossover"])
def test_sweep_and_crossover_take_the_engine_flags_with_their_docs(cmd):
    out = CliRunner().invoke(cli.main, [cmd, "--help"], terminal_width=10_000)
    text = " ".join(out.stdout.split())
    for flag, key in cli.ENGINE_FLAGS:
        assert flag in text and " ".join(C.setting_spec(key).doc.split()) in text, flag


def test_engine_flags_land_at_their_keys_and_are_refused_with_from_data():
    kw = {"engine": "submitit", "cluster": "local", "partition": None, "time_limit_min": 5,
          "cpus_per_task": None, "gpus_per_task": None, "mem_gb": None,
          "array_parallelism": 3, "engine_logs": "jobs"}
    cfg = cli.engine_from_flags(dict(kw), None)
    assert (cfg.name, cfg.cluster, cfg.time_limit_min, cfg.array_parallelism, cfg.log_dir) == \
        ("submitit", "local", 5, 3, "jobs")
    result = CliRunner().invoke(cli.main, ["sweep", "--from-data", __file__, "--engine",
                                           "submitit"])
    assert result.exit_code == 2 and "--engine choose where runs are made" in result.output
