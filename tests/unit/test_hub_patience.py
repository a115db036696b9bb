"""The simulator hub's patience: a wait gives up only when no worker has moved for timeout_s
of the time this process ran, so a long compute elsewhere or a suspended process is not a stall."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from gasloc_emu.simulator import memory
from gasloc_emu.simulator.memory import Hub
from gasloc_emu.transport.base import TransportError


def _later(seconds: float, fn) -> threading.Thread:
    th = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    th.start()
    return th


def test_a_wait_with_nobody_moving_gives_up_after_timeout():
    hub = Hub(2, timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(TransportError, match="no worker moved for 1 s"):
        hub.transport(1).recv(0, 0, "z")
    assert 1.0 <= time.monotonic() - t0 < 3.0


def test_a_peer_that_keeps_moving_is_waited_for_past_timeout():
    hub = Hub(2, timeout_s=1.0)
    sender = hub.transport(0)

    def busy_then_send():
        for _ in range(5):             # 2 s of reported compute, longer than the timeout
            sender.advance(0.01)
            time.sleep(0.4)
        sender.send(1, 0, "z", torch.ones(3))

    th = _later(0.0, busy_then_send)
    assert torch.equal(hub.transport(1).recv(0, 0, "z"), torch.ones(3))
    th.join()


def test_time_the_process_was_suspended_does_not_count(monkeypatch):
    # every slice "took" longer than SUSPENDED_AFTER_S: as if the process was stopped each time
    monkeypatch.setattr(memory, "SUSPENDED_AFTER_S", 0.5)
    hub = Hub(2, timeout_s=1.0)
    th = _later(2.5, lambda: hub.transport(0).send(1, 0, "z", torch.ones(2)))
    assert torch.equal(hub.transport(1).recv(0, 0, "z"), torch.ones(2))
    th.join()
