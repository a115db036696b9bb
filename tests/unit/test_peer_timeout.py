"""The receive backstop outlasts the heartbeat timeout and the slowest legitimate transfer."""
import dataclasses

import pytest

from gasloc_emu import config
from gasloc_emu.emulator.supervisor import peer_timeout_s
from gasloc_emu.training.model import count_parameters


class FakeNet:
    def __init__(self, mbit):
        self.mbit = mbit

    def configured_mbit(self, src, dst):
        return self.mbit(src, dst)


def cfg_with(model="tiny", hb=30.0):
    cfg = config.resolve(None, {"workers": 4, "model.preset": model})
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, heartbeat_timeout_s=hb))


def test_unshaped_run_gets_the_floor():
    assert peer_timeout_s(cfg_with(), FakeNet(lambda a, b: None)) == 600.0


def test_long_heartbeat_timeout_raises_the_backstop():
    # the supervisor must always be first to name a silent worker
    assert peer_timeout_s(cfg_with(hb=1000.0), FakeNet(lambda a, b: None)) == 4000.0


def test_slowest_link_sets_the_backstop_for_big_models():
    cfg = cfg_with(model="gpt2")
    slow = FakeNet(lambda a, b: 5.0 if (a, b) == (3, 0) else 1000.0)
    one_message_s = count_parameters(cfg.model) * 4 * 8 / 5e6
    assert one_message_s > 600  # gpt2 over 5 Mbit/s: the floor alone would cut it off
    assert peer_timeout_s(cfg, slow) == pytest.approx(4 * one_message_s)
