"""The run record's counters over every process a rank had (``emulator.tally``): a worker
that left as its scenario says sent its counters as it went (``Departed``); its successor
counts from 0, and the record adds them up, as ``simulate`` adds up every life of a worker."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gasloc_emu.emulator.processes import WorkerSlot
from gasloc_emu.emulator.tally import lifetime_counters, link_bytes


def _counters(sent: dict, raw: dict, reasons: dict) -> dict:
    return {"bytes_sent": sent, "bytes_recv": {}, "raw_bytes_sent": raw,
            "dropped": sum(reasons.values()), "drop_reasons": reasons, "wait_s": 0.0}


def _slot(rank: int, departed: list, final: dict | None, gone: bool = False) -> WorkerSlot:
    slot = WorkerSlot(rank=rank, proc=None, device=None, last_seen=0.0, gone=gone)
    slot.departed = departed
    slot.final = None if final is None else {"eval_loss": 2.5, "counters": final}
    return slot


def test_every_process_of_a_rank_is_counted_once():
    first = _counters({1: 100, 2: 50}, {1: 400, 2: 200}, {"stale": 1})
    second = _counters({2: 30}, {2: 120}, {"dead_peer": 2})
    last = _counters({1: 7}, {1: 28}, {"stale": 1})
    total = lifetime_counters(_slot(0, [first, second], last))
    assert total["bytes_sent"] == {1: 107, 2: 80}
    assert total["raw_bytes_sent"] == {1: 428, 2: 320}
    assert total["drop_reasons"] == {"stale": 2, "dead_peer": 2}
    assert total["dropped"] == 4


def test_a_worker_that_left_for_good_keeps_what_it_sent():
    gone = _slot(1, [_counters({0: 64}, {0: 64}, {})], None, gone=True)
    assert lifetime_counters(gone)["bytes_sent"] == {0: 64}
    assert link_bytes([gone]) == [{"src": 1, "dst": 0, "bytes": 64, "raw_bytes": 64}]
    assert lifetime_counters(_slot(2, [], None))["bytes_sent"] == {}


def test_the_launcher_waits_for_every_departed_process_counters_and_fails_without_them():
    """A process that left as the scenario says sends its counters as it goes; on a busy host
    they can come after the run's last final message, so the launcher waits for them before
    it sums the record's bytes, and ends the run failed naming the worker when one never
    comes (the bytes would be short)."""
    from gasloc_emu.emulator.errors import RunFailed
    from gasloc_emu.emulator.supervisor import Supervisor
    sup = object.__new__(Supervisor)
    late = SimpleNamespace(rank=4, departures=1, departed=[])
    sup.slots = [SimpleNamespace(rank=0, departures=0, departed=[]), late]
    served = []

    def serve(timeout_s):
        served.append(timeout_s)
        if len(served) == 3:   # it comes on the third look
            late.departed.append({"bytes_sent": {}})
    sup._serve = serve
    sup._await_departed(5.0)
    assert len(served) == 3
    late.departures = 2
    with pytest.raises(RunFailed, match=r"counters of the processes of workers \[4\] that left"):
        sup._await_departed(0.05)


def test_a_process_killed_without_a_word_counts_what_its_heartbeat_and_rows_said():
    """Its counters died with it: its last heartbeat's bytes and drops stand for them, with the
    messages it did without from a dead peer as its rows listed them (what the replay takes),
    not its heartbeat's count, which may be ahead of or behind its rows."""
    from gasloc_emu.emulator.tally import killed_counters
    hb = SimpleNamespace(sent={1: 300}, drop_reasons={"zap.key": 2, "dead_peer": 5})
    killed = killed_counters(hb, rows_dead_peer=1)
    assert killed["drop_reasons"] == {"zap.key": 2, "dead_peer": 1} and killed["dropped"] == 3
    slot = _slot(0, [], _counters({1: 7}, {1: 7}, {"dead_peer": 1}))
    slot.killed = [killed]
    total = lifetime_counters(slot)
    assert total["bytes_sent"] == {1: 307} and total["drop_reasons"] == {"zap.key": 2,
                                                                          "dead_peer": 2}
    assert killed_counters(None, 0)["drop_reasons"] == {}   # killed before its first heartbeat
