"""Device pinning: the (environment, device) pair of every worker, with no GPU needed."""
from __future__ import annotations

import json

import pytest

from gasloc_emu.training import devices
from gasloc_emu.training.devices import DeviceAssignment, DeviceError, assign_devices, visible_gpus


def _pairs(assignments: list[DeviceAssignment]) -> list[tuple[str, str]]:
    return [(a.env["CUDA_VISIBLE_DEVICES"], a.device) for a in assignments]


@pytest.fixture
def gpus(monkeypatch):
    """Pretend torch sees ``n`` GPUs, under an optional CUDA_VISIBLE_DEVICES of the launcher."""
    import torch

    def set_gpus(n: int, env: str | None = None) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        if env is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    return set_gpus


@pytest.mark.parametrize("ngpu, expected", [
    (1, [("0", "cuda:0")] * 4),
    (2, [("0", "cuda:0"), ("1", "cuda:0"), ("0", "cuda:0"), ("1", "cuda:0")]),
    (8, [(str(k), "cuda:0") for k in range(4)]),
])
def test_each_worker_sees_one_gpu_as_cuda0(gpus, ngpu, expected):
    gpus(ngpu)
    assert _pairs(devices.worker_devices("auto", 4)) == expected


def test_eight_gpus_sixteen_workers_round_robin(gpus):
    gpus(8)
    got = devices.worker_devices("cuda", 16)
    assert [a.gpu for a in got] == [str(k % 8) for k in range(16)]
    assert {a.device for a in got} == {"cuda:0"}
    assert [a.label for a in got[:3]] == ["gpu0", "gpu1", "gpu2"]


def test_launcher_restricted_to_some_gpus_keeps_their_physical_ids(gpus):
    gpus(2, env="2,3")
    assert _pairs(devices.worker_devices("auto", 3)) == [("2", "cuda:0"), ("3", "cuda:0"),
                                                          ("2", "cuda:0")]


def test_no_gpu_means_cpu_and_no_visible_devices(gpus):
    gpus(0)
    assert _pairs(devices.worker_devices("auto", 2)) == [("", "cpu"), ("", "cpu")]
    assert devices.simulator_device("auto") == "cpu"


def test_cpu_wanted_ignores_gpus(gpus):
    gpus(8)
    assert _pairs(devices.worker_devices("cpu", 2)) == [("", "cpu"), ("", "cpu")]
    assert devices.simulator_device("cpu") == "cpu"


def test_cuda_wanted_without_gpu_is_bad_input(gpus):
    gpus(0)
    with pytest.raises(DeviceError, match="no GPU is visible"):
        devices.worker_devices("cuda", 2)
    with pytest.raises(DeviceError):
        devices.simulator_device("cuda")


def test_simulator_shares_the_first_gpu(gpus):
    gpus(2, env="5,6")
    assert devices.simulator_device("auto") == "cuda:0"


def test_visible_gpus_reads_uuids_and_trims_to_what_cuda_counts():
    assert visible_gpus("GPU-a, GPU-b", 2) == ["GPU-a", "GPU-b"]
    assert visible_gpus("0,1,7", 2) == ["0", "1"]
    assert visible_gpus(None, 3) == ["0", "1", "2"]
    assert visible_gpus("", 0) == []


def test_unknown_device_choice_names_the_allowed_ones():
    with pytest.raises(ValueError, match="auto"):
        assign_devices("tpu", 1, [])


def test_the_launcher_spawns_each_worker_on_one_gpu_as_cuda0(gpus, monkeypatch, tmp_path):
    """The spawn itself, with two mocked GPUs: each worker process's environment names one GPU,
    round robin, and the launch spec tells the worker to use cuda:0. The stand-in workers exit
    at once (this machine may have no GPU), which ends the run as failed."""
    from gasloc_emu import config
    from gasloc_emu.emulator import launcher
    from gasloc_emu.emulator.zygote import Zygote
    from gasloc_emu.plan import build_plan
    from gasloc_emu.report.records import new_run_dir
    gpus(2)
    spawned: dict[int, dict] = {}
    real_spawn = Zygote.spawn

    def record(self, argv, env, log, append, netns=None, nice=0):
        spawned[int(argv[1])] = env
        # a run folder without a launch spec: the forked stand-in exits at once
        return real_spawn(self, [str(tmp_path / "nowhere"), argv[1]], env, log, append, netns,
                          nice)

    monkeypatch.setattr(Zygote, "spawn", record)
    cfg = config.resolve(overrides={"workers": 3, "model.preset": "tiny", "run.device": "cuda",
                                    "run.rounds": 1, "run.dashboard": "off"})
    out = new_run_dir(cfg, tmp_path / "run")
    result = launcher.launch(build_plan(cfg), out, log=lambda *_: None)
    assert result.code != 0     # the stand-ins exited; what matters is how they were started
    assert {r: env["CUDA_VISIBLE_DEVICES"] for r, env in spawned.items()} == \
        {0: "0", 1: "1", 2: "0"}
    spec = json.loads((out / "launch.json").read_text())
    assert spec["devices"] == ["cuda:0"] * 3
