"""Ctrl-C in ``simulate`` stops its worker threads before control returns: a thread still inside
a torch kernel when the interpreter exits aborts the whole process (SIGABRT) instead of letting
it exit with code 130."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate

pytestmark = pytest.mark.integration


def _sim_workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("sim-worker")]


@pytest.fixture
def ctrl_c_raises():
    """Python's own SIGINT handler for the test: a shell that starts a job in the background
    sets SIGINT to be ignored, and the signal would then never stop the run."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_raises")
def test_interrupt_returns_only_once_every_worker_thread_has_stopped(tmp_path):
    cfg = C.resolve(overrides={"workers": 8, "model.preset": "tiny", "run.rounds": 5000,
                               "algo.local_steps": 2, "topology.name": "ring",
                               "data.max_corpus_mb": 0.5, "data.eval_batches": 1,
                               "run.eval_every": 0, "run.dashboard": "off"})
    started = threading.Event()

    def progress(row: dict) -> None:   # the first settled round: every worker is computing
        if not started.is_set():
            started.set()
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()

    with pytest.raises(KeyboardInterrupt):
        simulate(build_plan(cfg), tmp_path / "r", progress=progress)
    assert started.is_set()
    assert not _sim_workers(), "worker threads still running after the interrupt"
