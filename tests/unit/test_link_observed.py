"""Link changes are measured: the ``sent_at`` header, the receiver's per-link accounting (a
fake clock), the worker's ``recv_links`` row field, and the launcher's matching of each link
change to the first metrics row that used the link afterwards."""
from __future__ import annotations

import math
import time
from types import SimpleNamespace

import msgpack
import pytest
import torch

from gasloc_emu.scenario.events import LinkEvent
from gasloc_emu.scenario.links import TimedLinks
from gasloc_emu.scenario.observed import link_changes, observed_link_changes
from gasloc_emu.training.worker import RoundStats, Worker, link_row
from gasloc_emu.transport import framing
from gasloc_emu.transport.framing import FrameError, Message, decode, encode
from gasloc_emu.transport.mailbox import MAX_TRANSFER_S, Mailbox, PeerBounds, RecvLinks
from gasloc_emu.transport.zmq_transport import ZmqTransport

WORLD, SELF = 4, 0
ROOMY = PeerBounds(max_msgs=1000, max_bytes=1 << 20)
NUMEL = 250  # float32: 1000 bytes per message


def _decode(frames) -> Message:
    return decode(frames, world_size=WORLD, self_rank=SELF, dtype=torch.float32,
                  max_numel=1 << 20, round_window=(0, 9))


def _header(**changes) -> dict:
    return {"v": framing.VERSION, "src": 1, "round": 5, "kind": "z", "dtype": "float32",
            "shape": [2, 3], "nbytes": 24} | changes


# -- the wire: sent_at

@pytest.mark.parametrize("sent_at", [0.0, 1.7e9 + 0.125, 12])
def test_sent_at_round_trips(sent_at):
    header, payload = encode(1, 5, "z", torch.ones(2, 3), deliver_at=3.5, sent_at=sent_at)
    msg = _decode([header, payload])
    assert (msg.sent_at, msg.deliver_at) == (float(sent_at), 3.5)
    assert msgpack.unpackb(header)["sent_at"] == sent_at
    unstamped = encode(1, 5, "z", torch.ones(2, 3))
    assert _decode(list(unstamped)).sent_at is None


@pytest.mark.parametrize("sent_at", [float("nan"), float("inf"), -float("inf"), "now", [1.0],
                                     True, None])
def test_a_bad_sent_at_is_refused_by_name(sent_at):
    frames = [msgpack.packb(_header(sent_at=sent_at)), bytes(24)]
    if sent_at is None:  # an explicit nil is as good as no stamp
        assert _decode(frames).sent_at is None
        return
    with pytest.raises(FrameError) as info:
        _decode(frames)
    assert info.value.reason == "sent_at" and "sent_at" in str(info.value)


def test_a_header_with_both_stamps_fits_the_map_limit():
    header, payload = encode(3, 9, "ag15", torch.ones(2, 3), deliver_at=1e9, sent_at=2e9)
    msg = _decode([header, payload])
    assert (msg.src, msg.deliver_at, msg.sent_at) == (3, 1e9, 2e9)


# -- the receiver: when a message became available, and what its link did

class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class StampShaping:
    """Releases a message at its stamp; any stamp is plausible."""

    def stamp(self, peer: int, nbytes: int, now_s: float) -> float | None:
        return None

    def release_at(self, src: int, deliver_at: float | None, arrival_s: float) -> float:
        return arrival_s if deliver_at is None else max(deliver_at, arrival_s)

    def latest_release_s(self, src: int, nbytes: int, arrival_s: float) -> float:
        return arrival_s + 1000.0


def _msg(src: int = 1, rnd: int = 0, kind: str = "z", sent_at: float | None = 99.0,
         deliver_at: float | None = None) -> Message:
    return Message(src, rnd, kind, torch.zeros(NUMEL), deliver_at, sent_at)


def test_available_is_the_arrival_without_a_shaper():
    mb = Mailbox(SELF, WORLD, 3, ROOMY, None, FakeClock(100.0))
    mb.accept(_msg(), arrival_s=99.5)
    assert mb.take_timed((1, 0, "z"))[1] == 99.5


def test_available_is_the_release_time_not_the_late_poll():
    clock = FakeClock(100.0)
    mb = Mailbox(SELF, WORLD, 3, ROOMY, StampShaping(), clock)
    mb.accept(_msg(deliver_at=101.0), arrival_s=100.0)   # held until 101
    clock.t = 103.0   # the worker only looks now
    mb.release_due()
    msg, available_s = mb.take_timed((1, 0, "z"))
    assert available_s == 101.0 and msg.sent_at == 99.0


def test_available_is_the_arrival_when_the_stamp_already_passed():
    mb = Mailbox(SELF, WORLD, 3, ROOMY, StampShaping(), FakeClock(100.0))
    mb.accept(_msg(deliver_at=99.2), arrival_s=99.7)
    assert mb.take_timed((1, 0, "z"))[1] == 99.7


def test_take_still_returns_the_message_and_forgets_its_time():
    mb = Mailbox(SELF, WORLD, 3, ROOMY, None, FakeClock())
    mb.accept(_msg(), arrival_s=99.0)
    mb.accept(_msg(kind="y"), arrival_s=99.5)
    assert mb.take((1, 0, "z")).src == 1 and list(mb._available_s) == [(1, 0, "y")]
    assert mb.take_timed((1, 0, "y"))[1] == 99.5 and not mb._available_s


def test_recv_links_sums_per_source_and_round():
    log = RecvLinks()
    assert log.note(_msg(1, 0, "rs0", sent_at=10.0), 10.5)
    assert log.note(_msg(1, 0, "ag0", sent_at=9.0), 9.25)
    assert log.note(_msg(2, 0, "rs0", sent_at=10.0), 11.0)
    assert log.note(_msg(1, 1, "rs0", sent_at=12.0), 12.1)
    round0 = log.take(0)
    assert (round0[1].nbytes, round0[1].messages) == (2 * 4 * NUMEL, 2)
    assert round0[1].transfer_s == pytest.approx(0.75) and round0[1].first_sent_at == 9.0
    assert round0[2].transfer_s == pytest.approx(1.0)
    assert log.take(0) == {}  # reported once
    assert log.take(1)[1].messages == 1


@pytest.mark.parametrize("available_s", [10.0, 9.0, 10.0 + MAX_TRANSFER_S + 1, math.inf])
def test_impossible_transfer_times_are_not_counted(available_s):
    log = RecvLinks()
    assert not log.note(_msg(sent_at=10.0), available_s)
    assert log.rejected == 1 and log.take(0) == {}


def test_an_unstamped_message_is_not_counted():
    log = RecvLinks()
    assert not log.note(_msg(sent_at=None), 10.0)
    assert log.note(_msg(kind="y", sent_at=9.0), 10.0)
    assert log.rejected == 0 and log.take(0)[1].messages == 1


def test_rounds_never_taken_are_bounded_and_older_ones_forgotten():
    log = RecvLinks(max_rounds=3)
    for r in range(5):
        log.note(_msg(rnd=r, sent_at=1.0), 2.0)
    assert sorted(log._rounds) == [2, 3, 4]
    log.take(3)
    assert sorted(log._rounds) == [4]


def test_a_zmq_transport_stamps_sent_at_and_measures_each_taken_message():
    with ZmqTransport(0, 2, "tcp://127.0.0.1:0", max_numel=NUMEL) as a, \
            ZmqTransport(1, 2, "tcp://127.0.0.1:0", max_numel=NUMEL) as b:
        a.connect({1: b.address})
        before = time.time()
        a.send(1, 0, "z", torch.ones(NUMEL))
        assert b.recv(0, 0, "z").sum() == NUMEL
        after = time.time()
        use = b.recv_links(0)[0]
        assert (use.nbytes, use.messages) == (4 * NUMEL, 1)
        assert before <= use.first_sent_at <= use.first_sent_at + use.transfer_s <= after
        assert b.recv_links(0) == {}


# -- the worker's row

def test_link_row_is_on_the_run_clock():
    use = RecvLinks()
    use.note(_msg(sent_at=1005.0), 1006.5)
    row = link_row(use.take(0)[1], t0_s=1000.0)
    assert row == {"bytes": 4 * NUMEL, "messages": 1, "transfer_s": 1.5, "sent_s": 5.0}


def test_the_row_has_recv_links_only_when_measured():
    base = dict(worker=0, round=0, step=1, train_loss=1.0, compute_s=0.1, comm_s=0.1,
                wait_s=0.0, bytes_sent=1, bytes_recv=1)
    assert "recv_links" not in RoundStats(**base).as_dict()
    links = {"1": {"bytes": 8, "messages": 1, "transfer_s": 0.5, "sent_s": 0.1}}
    assert RoundStats(**base, recv_links=links).as_dict()["recv_links"] == links


class _Measured:
    def __init__(self):
        self.log = RecvLinks()
        self.log.note(_msg(src=3, sent_at=1002.0), 1003.0)

    def recv_links(self, round_idx: int):
        return self.log.take(round_idx)


def test_worker_recv_links_needs_a_measuring_transport_and_the_run_clock():
    worker = Worker.__new__(Worker)   # only the fields recv_links reads
    worker.transport, worker.t0 = _Measured(), None
    assert worker.recv_links(0) is None   # the run's clock unknown: nothing to report
    worker.t0 = 1000.0
    assert worker.recv_links(0) == {"3": {"bytes": 4 * NUMEL, "messages": 1, "transfer_s": 1.0,
                                          "sent_s": 2.0}}
    worker.transport = object()   # the simulator's transport measures nothing
    assert worker.recv_links(0) is None


# -- the launcher: which row observes which change

def _use(nbytes: int, transfer_s: float, sent_s: float, messages: int = 1) -> dict:
    return {"bytes": nbytes, "messages": messages, "transfer_s": transfer_s, "sent_s": sent_s}


def _change(src=0, dst=1, round_idx=None, at_s=None, rate=2.0, latency_ms=0.0) -> dict:
    return {"src": src, "dst": dst, "round": round_idx, "at_s": at_s, "rate_mbit": rate,
            "latency_ms": latency_ms}


MB = 250_000  # 2 Mbit


def test_a_round_change_is_observed_in_the_first_row_at_or_after_its_round():
    rows = [{"worker": 1, "round": r, "recv_links": {"0": _use(MB, 0.1 if r < 2 else 1.0, r)}}
            for r in (3, 0, 1, 2)]
    out = observed_link_changes([_change(round_idx=2)], rows)
    assert out[0]["observed_round"] == 2 and out[0]["observed_mbit"] == pytest.approx(2.0)


def test_a_time_change_is_observed_where_the_first_message_was_sent_after_it():
    rows = [{"worker": 1, "round": 0, "recv_links": {"0": _use(MB, 0.04, 0.2)}},
            {"worker": 1, "round": 1, "recv_links": {"0": _use(2 * MB, 1.0, 0.49, 2)}},
            {"worker": 1, "round": 2, "recv_links": {"0": _use(2 * MB, 2.2, 1.5, 2)}},
            {"worker": 0, "round": 2, "recv_links": {"1": _use(2 * MB, 9.0, 1.5, 2)}}]
    out = observed_link_changes([_change(at_s=0.5, latency_ms=100.0)], rows)[0]
    # 4 Mbit over 2.2 s less two latencies of 0.1 s
    assert out["observed_round"] == 2 and out["observed_mbit"] == pytest.approx(2.0)
    assert out["at_s"] == 0.5 and out["round"] is None


def test_a_cut_is_not_observed_and_its_restore_is():
    rows = [{"worker": 1, "round": r, "recv_links": {"0": _use(MB, 1.0, r)}} for r in range(4)]
    cut, restore = observed_link_changes([_change(round_idx=1, rate=0.0),
                                          _change(round_idx=3, rate=2.0)], rows)
    assert (cut["observed_mbit"], cut["observed_round"]) == (None, None)
    assert (restore["observed_mbit"], restore["observed_round"]) == (2.0, 3)


def test_no_message_after_the_change_gives_null():
    rows = [{"worker": 1, "round": 0, "recv_links": {"0": _use(MB, 1.0, 0.1)}},
            {"worker": 1, "round": 1, "recv_links": {"2": _use(MB, 1.0, 0.9)}},
            {"worker": 0, "round": 1, "recv_links": {"1": _use(MB, 1.0, 0.9)}}]
    *unused, used = observed_link_changes([_change(round_idx=1), _change(at_s=0.5),
                                           _change(src=2, round_idx=1)], rows)
    for out in unused:
        assert (out["observed_mbit"], out["observed_round"]) == (None, None)
    assert (used["observed_mbit"], used["observed_round"]) == (2.0, 1)


def test_the_median_of_three_rounds_sees_through_a_transient_round():
    # 50 -> 5 Mbit/s applied while a message was in flight: the next one queued behind it
    transfers = {5: 1.313, 6: 0.995, 7: 1.025, 8: 5.0}   # 5 Mbit each: 3.8, 5.03, 4.88 Mbit/s
    rows = [{"worker": 1, "round": r, "recv_links": {"0": _use(625_000, s, r)}}
            for r, s in transfers.items()]
    out = observed_link_changes([_change(round_idx=5, rate=5.0)], rows)[0]
    assert out["observed_round"] == 5 and len(out["observed_each_mbit"]) == 3
    assert out["observed_mbit"] == pytest.approx(5 / 1.025, abs=1e-3)   # the middle, not 3.8


def test_a_change_is_read_only_until_the_links_next_change():
    rows = [{"worker": 1, "round": r, "recv_links": {"0": _use(MB, 1.0 if r < 3 else 0.1, r)}}
            for r in range(6)]
    first, second = observed_link_changes([_change(round_idx=1, rate=2.0),
                                           _change(round_idx=3, rate=20.0)], rows)
    assert first["observed_each_mbit"] == pytest.approx([2.0, 2.0])   # rounds 1 and 2 only
    assert second["observed_mbit"] == pytest.approx(20.0)


def test_a_transfer_within_the_latency_gives_null():
    rows = [{"worker": 1, "round": 0, "recv_links": {"0": _use(MB, 0.05, 0.1)}}]
    out = observed_link_changes([_change(round_idx=0, latency_ms=50.0)], rows)[0]
    assert out["observed_mbit"] is None and out["observed_round"] == 0


def test_link_changes_lists_round_changes_then_each_link_of_each_timed_one():
    timed = TimedLinks([LinkEvent(at_s=0.5, links=((0, 1), (1, 0)), rate_mbit=2.0),
                        LinkEvent(at_s=0.0, links=((0, 1),), rate_mbit=50.0)],
                       lambda src, dst: (None, 10.0))
    links = SimpleNamespace(changes={3: {(1, 2): (0.0, 10.0), (0, 2): (5.0, 20.0)},
                                     1: {(2, 3): (None, 10.0)}}, timed=timed)
    got = [(c["src"], c["dst"], c["round"], c["at_s"], c["rate_mbit"], c["latency_ms"])
           for c in link_changes(links)]
    assert got == [(2, 3, 1, None, None, 10.0), (0, 2, 3, None, 5.0, 20.0),
                   (1, 2, 3, None, 0.0, 10.0), (0, 1, None, 0.0, 50.0, 10.0),
                   (0, 1, None, 0.5, 2.0, 10.0), (1, 0, None, 0.5, 2.0, 10.0)]
