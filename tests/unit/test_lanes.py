"""What A2CiD2's lanes did, read back from metrics rows (``report.lanes``): exchanges per
gradient step and the share of exchange time spent while the worker's own step ran."""
from __future__ import annotations

import pytest

from gasloc_emu.report.lanes import LaneTally, overlap_s


def test_overlap_counts_only_the_covered_part_of_a_span():
    assert overlap_s((1.0, 3.0), [(0.0, 1.5), (2.5, 2.75)]) == pytest.approx(0.75)
    assert overlap_s((1.0, 3.0), []) == 0.0
    assert overlap_s((1.0, 3.0), [(3.0, 4.0)]) == 0.0


def _row(w, step_span, exchange_spans=None, peers=()):
    row = {"worker": w, "peers": list(peers), "step_span_s": list(step_span)}
    if exchange_spans is not None:
        row["exchange_spans_s"] = [list(s) for s in exchange_spans]
    return row


def test_two_exchanges_per_step_during_the_steps():
    t = LaneTally(2)
    for k in range(3):   # rate 2: every slot, one step [k, k+1] and two exchanges inside it
        t.add(_row(0, (k, k + 1), [(k, k + 0.25), (k + 0.5, k + 0.75)], peers=(1, 1)))
    rec = t.record()
    assert rec["comms_per_step"] == [2.0, 0.0] and rec["comms_per_step_mean"] == 2.0
    assert rec["exchange_s"] == pytest.approx(1.5) and rec["overlap_share"] == pytest.approx(1.0)


def test_an_exchange_after_the_step_does_not_overlap_it():
    # sequential (compute, then communicate): the share is 0
    t = LaneTally(1)
    t.add(_row(0, (0.0, 1.0), [(1.0, 1.5)], peers=(0,)))
    assert t.record()["overlap_share"] == 0.0


def test_a_slot_of_two_steps_counts_both_spans_and_then_forgets_them():
    # rate 1/2: one exchange per two steps, on the slot's last row; the next slot's exchange
    # overlaps only the next slot's steps
    t = LaneTally(1)
    t.add(_row(0, (0.0, 1.0)))
    t.add(_row(0, (1.0, 2.0), [(0.5, 1.5)], peers=(0,)))
    t.add(_row(0, (2.0, 3.0)))
    t.add(_row(0, (3.0, 4.0), [(1.0, 2.5)], peers=(0,)))   # not a real schedule: checks reset
    rec = t.record()
    assert rec["comms_per_step"] == [0.5]
    assert rec["overlap_share"] == pytest.approx((1.0 + 0.5) / 2.5)
