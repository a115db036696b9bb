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
from gasloc_emu.emulator.zygote import Zygote


class Store:
    """Node 0's rendezvous store as another node sees it: fine for ``beats`` beats, then gone
    (``how`` = "gone": the TCP store's error) or silent (its beats stop arriving)."""

    def __init__(self, beats: int, how: str):
        self.beats, self.how, self.left = beats, how, False

    def beat(self, dead, lives=None):
        self.beats -= 1
        if self.beats < 0 and self.how == "gone":
            raise RuntimeError("Connection reset by peer\nmore of torch's message")

    def ended(self):
        return None

    def successor(self, rank, life):
        return None

    def prune_order(self):
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

    def spawn(run_dir, rank, device, network, security, rejoin=None, zygote=None):
        procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      start_new_session=True))
        return procs[-1]

    monkeypatch.setattr(multinode, "spawn_worker", spawn)
    monkeypatch.setattr(multinode, "BEAT_S", 0.05)
    node = SimpleNamespace(ranks=range(2, 4), devices=[None, None], network=None,
                           security=None, rdv=Store(beats=3, how=how), zygote=Zygote(),
                           cfg=SimpleNamespace(run=SimpleNamespace(heartbeat_timeout_s=4.0)))
    t0 = time.monotonic()
    with pytest.raises(RunFailed) as got:
        multinode._serve_workers(node, tmp_path, SimpleNamespace(host="198.18.0.1"))
    assert str(got.value) == error
    assert time.monotonic() - t0 < 5.0
    assert len(procs) == 2 and not [p.pid for p in procs if alive(p.pid)]


def test_a_node_starts_the_successor_node_0_orders_for_a_departed_worker():
    """A scenario's leave ended rank 3's process here; node 0 orders its next life: this node
    starts it on the predecessor's address from the join round, once, and reports the life."""
    class Order:
        orders = {(3, 1): SimpleNamespace(rank=3, life=1, addr="tcp://198.18.0.2:40003",
                                          start=6)}

        def successor(self, rank, life):
            return self.orders.get((rank, life))

    class Proc:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    started = []
    procs, lives = {2: Proc(None), 3: Proc(-9)}, {2: 0, 3: 0}
    spawn = lambda rank, rejoin: started.append((rank, rejoin)) or Proc(None)  # noqa: E731
    multinode._successors(Order(), procs, lives, spawn)
    assert started == [(3, ("tcp://198.18.0.2:40003", 6))] and lives == {2: 0, 3: 1}
    multinode._successors(Order(), procs, lives, spawn)   # alive now: nothing more
    assert len(started) == 1 and procs[3].poll() is None
