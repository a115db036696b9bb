"""The sockets of ``netem measure`` over loopback: one pair within its bounds, and the
connections it refuses (an address that is not a participant, another run's key, another
pair, a sender asking for more than the receiver allows)."""
from __future__ import annotations

import threading
import time

import pytest

from netem import measure as wire
from netem.measureplan import MeasureBounds, PairBudget

LO = "127.0.0.1"
KEY = wire.derive_key(b"s" * 32, b"token")


def _serve(listener: wire.Listener, bounds: MeasureBounds, index: int = 0, wait_s: float = 5.0):
    """Accept and serve pair ``index`` (0 -> 1) in a thread; what happened, once joined."""
    out: dict = {}

    def body():
        try:
            sock = listener.accept_pair(index, 0, 1, time.monotonic() + wait_s)
        except wire.MeasureRunError as exc:
            out["error"] = str(exc)
            return
        try:
            out["report"] = wire.serve_pair(sock, PairBudget(bounds, time.monotonic(),
                                                             time.monotonic() + 100))
        finally:
            sock.close()
    t = threading.Thread(target=body)
    t.start()
    return t, out


def _send(listener, bounds, key=KEY, index=0, allowed=(LO,)):
    start = time.monotonic()
    budget = PairBudget(bounds, start, start + 100)
    sock = wire.connect_pair(LO, listener.port, source=LO, allowed=allowed, key=key,
                             index=index, src=0, dst=1, deadline_s=budget.deadline_s)
    try:
        res = wire.send_pair(sock, budget, 0, 1)
    finally:
        wire.abort_close(sock)
    return res, time.monotonic() - start


@pytest.fixture
def listener():
    with wire.Listener(LO, KEY) as lst:
        lst.allowed = frozenset({LO})
        yield lst


def test_a_transfer_stops_at_the_byte_bound(listener):
    bounds = MeasureBounds(max_bytes_per_pair=1 << 20, max_seconds_per_pair=5.0, pings=5)
    t, out = _serve(listener, bounds)
    res, seconds = _send(listener, bounds)
    t.join(10)
    assert res.ok, res.error
    assert res.ended_by == "max_bytes_per_pair" and res.receiver["bytes"] == 1 << 20
    assert res.sender["bytes_written"] == 1 << 20 and res.rtt["count"] == 5
    assert res.sender["rtt_us"] > 0 and seconds < 5.0
    assert res.receiver["clock"].startswith("kernel receive timestamps")
    assert set(res.sender["while_writing"]) >= {"sending", "rwnd_limited", "idle"}


def test_a_transfer_stops_at_the_time_bound_and_the_pair_within_it(listener):
    bounds = MeasureBounds(max_bytes_per_pair=64 * 2**30, max_seconds_per_pair=0.6, pings=3)
    t, out = _serve(listener, bounds)
    res, seconds = _send(listener, bounds)
    t.join(10)
    assert res.ok, res.error
    assert res.ended_by == "max_seconds_per_pair"
    assert res.sender["bytes_written"] < bounds.max_bytes_per_pair
    assert seconds <= 0.6 + 0.05, seconds          # the pair's whole time, report included
    assert res.receiver["seconds"] <= 0.6


def test_an_address_that_is_not_a_participant_is_refused(listener):
    with pytest.raises(wire.AddressRefused, match="127.0.0.1.*not one of the participating"):
        wire.connect_pair(LO, listener.port, source=LO, allowed={"198.18.0.9"}, key=KEY,
                          index=0, src=0, dst=1, deadline_s=time.monotonic() + 1)
    listener.allowed = frozenset({"198.18.0.9"})   # the listener's side: closed unread
    t, out = _serve(listener, MeasureBounds(), wait_s=1.0)
    with pytest.raises(wire.MeasureRunError):
        _send(listener, MeasureBounds())
    t.join(10)
    assert "no authenticated connection" in out["error"]
    assert listener.refused and "not a participating host" in listener.refused[0]


@pytest.mark.parametrize("key, index, why", [
    (wire.derive_key(b"s" * 32, b"another token"), 0, "the receiver failed the handshake"),
    (KEY, 7, "handshake"),
])
def test_another_runs_key_or_another_pair_gets_nothing(listener, key, index, why):
    t, out = _serve(listener, MeasureBounds(), wait_s=1.0)
    with pytest.raises(wire.MeasureRunError, match=why):
        _send(listener, MeasureBounds(), key=key, index=index)
    t.join(10)
    assert "no authenticated connection" in out["error"] and listener.refused


def test_a_sender_asking_for_more_than_the_receiver_allows_gets_an_error(listener):
    t, out = _serve(listener, MeasureBounds(max_bytes_per_pair=1 << 20))
    res, _ = _send(listener, MeasureBounds(max_bytes_per_pair=2 << 20, pings=1))
    t.join(10)
    assert not res.ok and "asked for 2097152 bytes" in res.error
