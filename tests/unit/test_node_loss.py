"""A node other than 0 ends its run when node 0 dies: its workers are stopped and the error
names node 0 (the same as tests/net/test_multinode.py's killed node 0, on emulated hosts)."""
from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from gasloc_emu.cluster import multinode
from gasloc_emu.emulator.errors import RunFailed


class Store:
    """Node 0's rendezvous store as another node sees it: fine for ``beats`` beats, then gone
    (``how`` = "gone": the TCP store's error) or silent (its beats stop arriving)."""

    def __init__(self, beats: int, how: str):
        self.beats, self.how, self.left = beats, how, False

    def beat(self, dead):
        self.beats -= 1
        if self.beats < 0 and self.how == "gone":
            raise RuntimeError("Connection reset by peer\nmore of torch's message")

    def ended(self):
        return None

    def silent_s(self, node, now):
        return 0.0 if self.beats >= 0 or self.how == "gone" else 99.0

    def leave(self):
        self.left = True


@pytest.mark.parametrize("how, error", [
    ("gone", "lost node 0 (198.18.0.1): Connection reset by peer"),
    ("silent", "node 0 (198.18.0.1) silent for 99 s")])
def test_a_lost_node_0_ends_this_nodes_run_and_its_workers(monkeypatch, tmp_path, alive, how,
                                                           error):
    procs = []

    def spawn(run_dir, rank, device, network, security, zygote=None):
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      start_new_session=True))
        return procs[-1]

    monkeypatch.setattr(multinode, "spawn_worker", spawn)
    monkeypatch.setattr(multinode, "BEAT_S", 0.05)
    node = SimpleNamespace(ranks=range(2, 4), devices=[None, None], network=None,
                           security=None, rdv=Store(beats=3, how=how),
                           cfg=SimpleNamespace(run=SimpleNamespace(heartbeat_timeout_s=4.0)))
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as got:
        multinode._serve_workers(node, tmp_path, SimpleNamespace(host="198.18.0.1"))
    assert str(got.value) == error
    assert time.monotonic() - t0 < 5.0
    assert len(procs) == 2 and not [p.pid for p in procs if alive(p.pid)]
