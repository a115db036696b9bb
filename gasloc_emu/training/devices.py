"""Which device each worker uses, and the environment that pins it there.

Emulator workers are pinned by the environment: worker k starts with ``CUDA_VISIBLE_DEVICES``
naming one GPU (round-robin over the GPUs the launcher sees), so inside the worker that GPU is
the only one and is called ``cuda:0``. The physical GPU is recorded next to it (``gpu``), as the
launcher's own ``CUDA_VISIBLE_DEVICES`` names it (an index or a UUID), so that the run record
and the dashboard say which card a worker ran on. The simulator runs every worker in one process
and shares one device among them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from gasloc_emu.config import ConfigError

DEVICE_CHOICES = ("auto", "cpu", "cuda")


class DeviceError(ConfigError):
    """``run.device = 'cuda'`` on a machine where no GPU is visible (bad input: exit 2)."""


@dataclass(frozen=True)
class DeviceAssignment:
    """One worker's device as torch names it inside the worker, and the environment to start it
    with."""

    device: str                      # "cpu" or "cuda:0" (the one GPU the worker sees)
    gpu: str | None = None           # the physical GPU, as the launcher's environment names it
    env: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """What the dashboard and the record show: "cpu" or "gpu<physical id>"."""
        return "cpu" if self.gpu is None else f"gpu{self.gpu}"


def visible_gpus(cuda_visible_devices: str | None, count: int) -> list[str]:
    """The ids of the ``count`` GPUs this process sees, as CUDA_VISIBLE_DEVICES would name them.

    Without the variable they are 0..count-1; with it, its first ``count`` entries (CUDA ignores
    entries after an invalid one, which is why ``count`` comes from CUDA, not from the string).
    """
    if cuda_visible_devices is None:
        return [str(i) for i in range(count)]
    ids = [part.strip() for part in cuda_visible_devices.split(",") if part.strip()]
    return ids[:count]


def assign_devices(want: str, workers: int, gpus: list[str]) -> list[DeviceAssignment]:
    """Worker k on GPU ``gpus[k % len(gpus)]`` (as ``cuda:0`` inside), or every worker on the
    CPU."""
    if want not in DEVICE_CHOICES:
        raise ValueError(f"run.device = {want!r}; expected one of {DEVICE_CHOICES}")
    if want == "cuda" and not gpus:
        raise DeviceError("run.device = 'cuda' but no GPU is visible")
    if want == "cpu" or not gpus:
        return [DeviceAssignment("cpu", None, {"CUDA_VISIBLE_DEVICES": ""})
                for _ in range(workers)]
    return [DeviceAssignment("cuda:0", g, {"CUDA_VISIBLE_DEVICES": g})
            for g in (gpus[k % len(gpus)] for k in range(workers))]


def worker_devices(want: str, workers: int) -> list[DeviceAssignment]:
    """The assignment for this machine: the GPUs torch sees, under the launcher's environment."""
    return assign_devices(want, workers, visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                      _gpu_count(want)))


def simulator_device(want: str) -> str:
    """The one device the simulator's workers share: the first visible GPU, else the CPU."""
    gpus = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), _gpu_count(want))
    return assign_devices(want, 1, gpus[:1])[0].device


def threads_per_worker(cfg) -> int:
    """Torch CPU threads per worker, so that N emulator processes do not oversubscribe the cores.

    The simulator uses the same number: CPU kernels sum in an order that depends on the thread
    count, so equal counts are what make simulator and emulator agree to the last bit.
    """
    return cfg.run.threads_per_worker or max(1, (os.cpu_count() or 1) // cfg.workers)


def _gpu_count(want: str) -> int:
    if want == "cpu":
        return 0
    import torch  # only here: the CPU path should not need to initialise CUDA
    return torch.cuda.device_count()
