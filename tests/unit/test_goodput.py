"""What each link delivered while training, from the metrics rows' link observations."""
from __future__ import annotations

import pytest

from gasloc_emu.emulator.tally import Goodput


def row(worker: int, **links) -> dict:
    return {"worker": worker, "recv_links": {
        src.removeprefix("w"): {"bytes": b, "messages": m, "transfer_s": t, "sent_s": 0.0}
        for src, (b, m, t) in links.items()}}


def test_goodput_is_the_bytes_over_the_summed_transfer_time_of_each_link():
    g = Goodput()
    g.note(row(1, w0=(1_000_000, 1, 1.6), w2=(1_000_000, 1, 0.16)))
    g.note(row(1, w0=(1_000_000, 1, 1.6)))
    g.note({"worker": 0})  # a row without observations (the simulator's, an old worker's)
    slow, fast, idle = g.add_to([{"src": 0, "dst": 1, "configured_mbit": 5.0},
                                 {"src": 2, "dst": 1, "configured_mbit": 50.0},
                                 {"src": 1, "dst": 0, "configured_mbit": 5.0}])
    assert slow["training_goodput_mbit"] == pytest.approx(5.0)
    assert slow["training_messages"] == 2 and slow["training_transfer_s"] == pytest.approx(3.2)
    assert fast["training_goodput_mbit"] == pytest.approx(50.0)
    assert "training_goodput_mbit" not in idle
