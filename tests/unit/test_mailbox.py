"""The mailbox's rules without sockets: hand-made messages, a fake clock and a fake shaper."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gasloc_emu.transport.framing import Message
from gasloc_emu.transport.mailbox import Mailbox, Numbering, PeerBounds
from gasloc_emu.transport.zmq_transport import Shaping as ReexportedShaping
from gasloc_emu.transport.zmq_transport import ZmqTransport, _peer_bounds
from netem.userspace import MAX_QUEUE_S, RELEASE_SLACK_S, LinkShaper, shaping_from_spec

WORLD, SELF, AHEAD = 4, 0, 3
ROOMY = PeerBounds(max_msgs=1000, max_bytes=1 << 20)


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeShaping:
    """Releases a message at its stamp (``deliver_at``), or at once when it has none; a stamp
    more than ``max_hold_s`` after arrival is beyond what any link could need."""

    max_hold_s = 1000.0

    def stamp(self, peer: int, nbytes: int, now_s: float) -> float | None:
        return None

    def release_at(self, src: int, deliver_at: float | None, arrival_s: float) -> float:
        return arrival_s if deliver_at is None else deliver_at

    def latest_release_s(self, src: int, nbytes: int, arrival_s: float) -> float:
        return arrival_s + self.max_hold_s


def _mailbox(bounds: PeerBounds = ROOMY, shaped: bool = False, clock: FakeClock | None = None,
             ahead: int = AHEAD) -> Mailbox:
    return Mailbox(SELF, WORLD, ahead, bounds, FakeShaping() if shaped else None,
                   clock or FakeClock())


def _msg(src: int = 1, rnd: int = 0, kind: str = "z", numel: int = 1, fill: float = 0.0,
         deliver_at: float | None = None) -> Message:
    return Message(src, rnd, kind, torch.full((numel,), fill), deliver_at)


def _accept(mb: Mailbox, msg: Message) -> str | None:
    return mb.accept(msg, arrival_s=100.0)


# -- the round window

def test_window_edges_at_the_current_round():
    mb = _mailbox()
    mb.set_round(5)
    assert mb.window() == (4, 5 + AHEAD)
    assert _accept(mb, _msg(rnd=4)) is None            # current - 1: a late message
    assert _accept(mb, _msg(rnd=3)) == "round"         # current - 2
    assert _accept(mb, _msg(rnd=5 + AHEAD)) is None    # the furthest ahead allowed
    assert _accept(mb, _msg(rnd=6 + AHEAD)) == "round"
    assert sorted(mb.held_keys()) == [(1, 4, "z"), (1, 5 + AHEAD, "z")]
    assert mb.drop_reasons == {"round": 2}


def test_note_round_only_moves_forward_and_set_round_moves_either_way():
    mb = _mailbox()
    mb.note_round(4)
    mb.note_round(2)
    assert mb.round == 4
    mb.set_round(1)
    assert mb.round == 1 and mb.window() == (0, 1 + AHEAD)


def test_a_round_leaving_the_window_drops_its_unclaimed_messages_as_stale():
    mb = _mailbox()
    for src in (1, 2):
        _accept(mb, _msg(src=src, rnd=0, numel=10))
    _accept(mb, _msg(src=1, rnd=1))
    mb.note_round(1)  # window [0, ...]: round 0 is still claimable
    assert len(mb.held_keys()) == 3 and mb.dropped == 0
    mb.note_round(2)
    assert mb.held_keys() == [(1, 1, "z")]
    assert mb.drop_reasons == {"stale": 2}
    assert mb.peer_usage(1) == (1, 4) and mb.peer_usage(2) == (0, 0)  # room given back


def test_a_sender_that_is_not_a_peer_is_refused():
    mb = _mailbox()
    assert _accept(mb, _msg(src=SELF)) == "src"
    assert _accept(mb, _msg(src=WORLD)) == "src"
    assert mb.held_keys() == []


# -- duplicates

def test_a_duplicate_is_dropped_and_the_first_is_kept():
    mb = _mailbox()
    assert _accept(mb, _msg(fill=1.0)) is None
    assert _accept(mb, _msg(fill=2.0)) == "duplicate"
    assert torch.equal(mb.take((1, 0, "z")).tensor, torch.full((1,), 1.0))
    assert _accept(mb, _msg(fill=3.0)) == "duplicate"  # taken is still seen: it may be in use
    assert not mb.has((1, 0, "z"))
    assert mb.drop_reasons == {"duplicate": 2}


def test_the_same_kind_and_round_from_another_peer_is_not_a_duplicate():
    mb = _mailbox()
    assert _accept(mb, _msg(src=1)) is None
    assert _accept(mb, _msg(src=2)) is None
    assert _accept(mb, _msg(src=1, kind="y")) is None
    assert mb.dropped == 0


def test_take_hands_out_once_and_refuses_what_is_not_here():
    mb = _mailbox()
    _accept(mb, _msg(numel=3))
    assert mb.has((1, 0, "z"))
    assert mb.take((1, 0, "z")).src == 1
    assert mb.peer_usage(1) == (0, 0)
    with pytest.raises(KeyError, match=r"\(1, 0, 'z'\)"):
        mb.take((1, 0, "z"))


# -- the release queue

def test_shaped_messages_are_released_when_the_clock_reaches_them_in_release_order():
    clock = FakeClock(100.0)
    mb = _mailbox(shaped=True, clock=clock)
    for kind, at in (("c", 103.0), ("a", 101.0), ("b", 102.0)):
        assert _accept(mb, _msg(kind=kind, deliver_at=at)) is None
    assert mb.next_release_s() == 101.0
    clock.t = 100.999
    mb.release_due()
    assert mb.held_keys() == [] and mb.pending_count() == 3
    clock.t = 101.0  # exactly due
    mb.release_due()
    assert mb.held_keys() == [(1, 0, "a")] and mb.next_release_s() == 102.0
    clock.t = 110.0
    mb.release_due()
    assert mb.held_keys() == [(1, 0, "a"), (1, 0, "b"), (1, 0, "c")]
    assert mb.next_release_s() is None and mb.pending_count() == 0


def test_a_release_time_already_past_keeps_the_message_at_once():
    mb = _mailbox(shaped=True, clock=FakeClock(100.0))
    assert _accept(mb, _msg(deliver_at=99.0)) is None
    assert mb.has((1, 0, "z")) and mb.pending_count() == 0


def test_a_message_whose_round_left_the_window_while_held_back_is_stale_on_release():
    clock = FakeClock(100.0)
    mb = _mailbox(shaped=True, clock=clock)
    _accept(mb, _msg(rnd=0, numel=5, deliver_at=101.0))
    _accept(mb, _msg(rnd=1, numel=5, deliver_at=101.0))
    mb.note_round(2)  # window [1, ...]
    assert mb.dropped == 0  # still waiting: judged when it is released
    clock.t = 101.0
    mb.release_due()
    assert mb.held_keys() == [(1, 1, "z")]
    assert mb.drop_reasons == {"stale": 1}
    assert mb.peer_usage(1) == (1, 20)


def test_a_message_released_after_the_window_moved_back_still_blocks_its_duplicates():
    """Found by the property below: the copy used to overwrite the first, uncounted."""
    clock = FakeClock(100.0)
    mb = _mailbox(shaped=True, clock=clock)
    _accept(mb, _msg(rnd=1, deliver_at=101.0))
    mb.set_round(5)  # round 1's duplicate records are pruned; its message is still held back
    mb.set_round(1)  # e.g. a resume
    clock.t = 101.0
    mb.release_due()
    assert _accept(mb, _msg(rnd=1)) == "duplicate"
    assert mb.peer_usage(1) == (1, 4)


def test_a_duplicate_of_a_message_held_back_is_dropped():
    mb = _mailbox(shaped=True, clock=FakeClock(100.0))
    _accept(mb, _msg(deliver_at=105.0))
    assert _accept(mb, _msg()) == "duplicate"


# -- delivery times are bounded by what the link could need

def test_a_far_future_stamp_is_dropped_and_leaves_room_for_the_real_message():
    mb = _mailbox(shaped=True, clock=FakeClock(100.0))
    assert mb.accept(_msg(deliver_at=100.0 + 1e9), arrival_s=100.0) == "deliver_at"
    assert mb.pending_count() == 0 and mb.peer_usage(1) == (0, 0)
    assert mb.accept(_msg(deliver_at=101.0), arrival_s=100.0) is None  # not a duplicate
    assert mb.drop_reasons == {"deliver_at": 1}


def test_a_stamp_just_within_the_bound_is_held_until_then():
    clock = FakeClock(100.0)
    mb = _mailbox(shaped=True, clock=clock)
    assert mb.accept(_msg(deliver_at=100.0 + FakeShaping.max_hold_s), arrival_s=100.0) is None
    clock.t = 100.0 + FakeShaping.max_hold_s
    mb.release_due()
    assert mb.has((1, 0, "z"))


RATE_MBIT, LATENCY_MS = 10.0, 20.0
SPEC = {"mode": "userspace", "workers": 2, "links": [[0, 1, RATE_MBIT, LATENCY_MS],
                                                      [1, 0, RATE_MBIT, LATENCY_MS]],
        "up_mbit": {}, "max_queue_s": MAX_QUEUE_S}


def test_the_link_bound_is_latency_queue_one_message_and_slack():
    receiver = shaping_from_spec(SPEC, 0)
    nbytes = 125_000  # 0.1 s at 10 Mbit/s
    want = 100.0 + LATENCY_MS / 1e3 + MAX_QUEUE_S + 0.1 + RELEASE_SLACK_S
    assert receiver.latest_release_s(1, nbytes, 100.0) == pytest.approx(want)
    mb = Mailbox(0, 2, AHEAD, ROOMY, receiver, FakeClock(100.0))
    assert mb.accept(_msg(numel=nbytes // 4, deliver_at=want - 1e-6), 100.0) is None
    assert mb.accept(_msg(numel=nbytes // 4, kind="y", deliver_at=want + 1e-3),
                     100.0) == "deliver_at"


def test_an_uplink_cap_below_the_link_rate_widens_the_bound():
    capped = SPEC | {"up_mbit": {"1": RATE_MBIT / 2}}
    slow, fast = shaping_from_spec(capped, 0), shaping_from_spec(SPEC, 0)
    assert slow.latest_release_s(1, 125_000, 0.0) == pytest.approx(
        fast.latest_release_s(1, 125_000, 0.0) + 0.1)


@settings(deadline=None, max_examples=100)
@given(sends=st.lists(st.tuples(st.integers(0, 2_000_000), st.floats(0.0, 0.3)), max_size=30))
def test_every_stamp_a_real_sender_makes_is_within_the_receivers_bound(sends):
    """The sender's own LinkShaper (its backpressure sleeps on the fake clock) never stamps a
    message that the receiver's bound would drop, however big or bursty the traffic."""
    clock = FakeClock(100.0)

    def sleep(seconds: float) -> None:
        clock.t += seconds

    sender = LinkShaper(1, "userspace", {0: (RATE_MBIT, LATENCY_MS)}, {}, sleep=sleep)
    receiver = shaping_from_spec(SPEC, 0)
    for nbytes, gap_s in sends:
        clock.t += gap_s
        deliver_at = sender.stamp(0, nbytes, clock.t)
        arrival_s = clock.t  # sent once the backpressure sleep is over; loopback is instant
        release_s = receiver.release_at(1, deliver_at, arrival_s)
        assert release_s <= receiver.latest_release_s(1, nbytes, arrival_s)


# -- bounds

def test_overflow_by_message_count_is_per_peer():
    mb = _mailbox(PeerBounds(max_msgs=3, max_bytes=1 << 20))
    results = [_accept(mb, _msg(src=1, kind=f"k{i}", numel=0)) for i in range(4)]
    assert results == [None, None, None, "overflow"]
    assert [_accept(mb, _msg(src=2, kind=f"k{i}")) for i in range(3)] == [None] * 3
    assert mb.peer_usage(1) == (3, 0)
    mb.take((1, 0, "k0"))
    assert _accept(mb, _msg(src=1, kind="k3", numel=0)) is None  # room again
    assert mb.drop_reasons == {"overflow": 1}


def test_overflow_by_bytes_is_per_peer():
    mb = _mailbox(PeerBounds(max_msgs=100, max_bytes=100))
    assert _accept(mb, _msg(src=1, kind="a", numel=10)) is None   # 40 bytes
    assert _accept(mb, _msg(src=1, kind="b", numel=10)) is None   # 80
    assert _accept(mb, _msg(src=1, kind="c", numel=10)) == "overflow"  # would be 120
    assert _accept(mb, _msg(src=1, kind="d", numel=5)) is None    # exactly 100
    assert _accept(mb, _msg(src=2, kind="a", numel=25)) is None   # another peer's 100
    assert mb.peer_usage(1) == (3, 100) and mb.peer_usage(2) == (1, 100)
    assert mb.drop_reasons == {"overflow": 1}


def test_messages_held_back_for_release_count_against_the_bound():
    mb = _mailbox(PeerBounds(max_msgs=100, max_bytes=80), shaped=True, clock=FakeClock(100.0))
    assert _accept(mb, _msg(kind="a", numel=20, deliver_at=200.0)) is None
    assert _accept(mb, _msg(kind="b", numel=1, deliver_at=200.0)) == "overflow"
    assert mb.pending_count() == 1


def test_an_overflowed_message_is_not_remembered_as_seen():
    mb = _mailbox(PeerBounds(max_msgs=1, max_bytes=1 << 20))
    _accept(mb, _msg(kind="a"))
    assert _accept(mb, _msg(kind="b")) == "overflow"
    mb.take((1, 0, "a"))
    assert _accept(mb, _msg(kind="b")) is None  # a resend is welcome once there is room


@pytest.mark.parametrize("world", [2, 3, 8, 64])
def test_default_bounds_hold_a_gossip_neighbour_across_the_whole_window(world):
    model_numel, ahead = 1000, 16
    bounds = PeerBounds.for_model(4 * model_numel, world, ahead)
    mb = Mailbox(0, world, ahead, bounds)
    mb.set_round(10)
    for rnd in range(9, 10 + ahead + 1):  # one model-sized message per round of the window
        assert mb.accept(_msg(rnd=rnd, numel=model_numel), 0.0) is None
    assert mb.dropped == 0


@pytest.mark.parametrize("world", [2, 3, 8, 64])
def test_default_bounds_hold_the_ring_all_reduce_of_this_round_and_the_next(world):
    """The previous worker on the ring leads by at most one round: 2 x 2(n-1) chunks."""
    model_numel = 1001
    bounds = PeerBounds.for_model(4 * model_numel, world, 16)
    mb = Mailbox(0, world, 16, bounds)
    mb.set_round(3)
    chunk = len(torch.tensor_split(torch.empty(model_numel), world)[0])  # the largest
    for rnd in (3, 4):
        for phase in ("rs", "ag"):
            for s in range(world - 1):
                assert mb.accept(_msg(src=world - 1, rnd=rnd, kind=f"{phase}{s}", numel=chunk),
                                 0.0) is None
    assert mb.dropped == 0


def test_default_bounds_are_stated_in_models():
    model_bytes = 482_304  # tiny: 120576 float32 parameters
    assert PeerBounds.for_model(model_bytes, 2, 16) == PeerBounds(18, 18 * model_bytes)
    assert PeerBounds.for_model(model_bytes, 8, 16) == PeerBounds(42, 18 * model_bytes)


# -- counters, lifecycle, configuration

def test_drops_are_counted_by_reason():
    mb = _mailbox(PeerBounds(max_msgs=2, max_bytes=1 << 20))
    mb.refuse("header")  # what framing refused to decode
    _accept(mb, _msg(kind="a"))
    _accept(mb, _msg(kind="a"))                # duplicate
    _accept(mb, _msg(kind="b"))
    _accept(mb, _msg(kind="c"))                # overflow
    _accept(mb, _msg(rnd=AHEAD + 1))           # round
    mb.note_round(2)                           # a and b: stale
    assert mb.drop_reasons == {"header": 1, "duplicate": 1, "overflow": 1, "round": 1,
                               "stale": 2}
    assert mb.dropped == 6


def test_clear_forgets_messages_but_keeps_the_counters():
    mb = _mailbox(shaped=True, clock=FakeClock(100.0))
    _accept(mb, _msg(kind="a"))
    _accept(mb, _msg(kind="b", deliver_at=200.0))
    _accept(mb, _msg(kind="a"))
    mb.clear()
    assert mb.held_keys() == [] and mb.pending_count() == 0 and mb.next_release_s() is None
    assert mb.peer_usage(1) == (0, 0) and mb.drop_reasons == {"duplicate": 1}


@pytest.mark.parametrize(("kw", "match"), [
    ({"rank": 4}, r"rank 4 outside \[0, 4\)"),
    ({"rank": -1}, r"rank -1 outside \[0, 4\)"),
    ({"world_size": 0, "rank": 0}, "world_size must be an int >= 1, got 0"),
    ({"max_rounds_ahead": 0}, "max_rounds_ahead must be an int >= 1, got 0"),
    ({"max_rounds_ahead": 2.5}, "max_rounds_ahead must be an int >= 1, got 2.5"),
])
def test_bad_configuration_is_refused_naming_the_value(kw, match):
    args = {"rank": 0, "world_size": WORLD, "max_rounds_ahead": AHEAD, "bounds": ROOMY} | kw
    with pytest.raises(ValueError, match=match):
        Mailbox(**args)


@pytest.mark.parametrize(("msgs", "nbytes", "match"), [
    (0, 10, "max_msgs must be an int >= 1, got 0"),
    (10, -1, "max_bytes must be an int >= 1, got -1"),
    (1.5, 10, "max_msgs must be an int >= 1, got 1.5"),
])
def test_bad_bounds_are_refused_naming_the_value(msgs, nbytes, match):
    with pytest.raises(ValueError, match=match):
        PeerBounds(msgs, nbytes)


def test_bounds_must_be_peer_bounds():
    with pytest.raises(TypeError, match="PeerBounds"):
        Mailbox(0, WORLD, AHEAD, (10, 10))


def test_shaping_is_still_importable_from_the_transport():
    from gasloc_emu.transport import mailbox
    assert ReexportedShaping is mailbox.Shaping


# -- a property: bounded memory and exact accounting under any traffic

PROPERTY_BOUNDS = PeerBounds(max_msgs=3, max_bytes=60)

# two senders, so that one often fills its bound; empty messages test the count bound alone
accepts = st.tuples(st.just("accept"), st.integers(1, 2), st.integers(-3, AHEAD + 2),
                    st.sampled_from("abc"), st.sampled_from([0, 0, 1, 5, 12]),
                    st.none() | st.sampled_from([0.0, 0.5, 2.0]))
others = st.one_of(st.tuples(st.just("tick"), st.sampled_from([0.25, 1.0])),
                   st.tuples(st.just("note"), st.integers(0, 3)),
                   st.tuples(st.just("set"), st.integers(0, 8)),
                   st.tuples(st.just("take")))
# bursts of arrivals between the other events, so that the bounds are often reached
traffic = st.lists(st.tuples(st.lists(accepts, max_size=8), others), max_size=25).map(
    lambda steps: [op for burst, other in steps for op in (*burst, other)])


class _Run:
    """Feeds operations to a shaped mailbox and counts what went in and came out."""

    def __init__(self):
        self.clock = FakeClock(100.0)
        self.mb = _mailbox(PROPERTY_BOUNDS, shaped=True, clock=self.clock)
        self.fed = self.taken = 0

    def apply(self, op: tuple) -> None:
        getattr(self, "_" + op[0])(*op[1:])

    def _accept(self, src, offset, kind, numel, delay):
        at = None if delay is None else self.clock.t + delay
        self.mb.accept(_msg(src, self.mb.round + offset, kind, numel, deliver_at=at),
                       self.clock.t)
        self.fed += 1

    def _tick(self, dt):
        self.clock.t += dt
        self.mb.release_due()

    def _note(self, k):
        self.mb.note_round(self.mb.round + k)

    def _set(self, rnd):
        self.mb.set_round(rnd)

    def _take(self):
        if self.mb.held_keys():
            self.mb.take(self.mb.held_keys()[0])
            self.taken += 1

    def unaccounted(self) -> int:
        return (self.fed - self.taken - self.mb.dropped - len(self.mb.held_keys())
                - self.mb.pending_count())


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(traffic)
def test_any_traffic_stays_within_the_bounds_and_every_message_is_accounted_once(seq):
    run = _Run()
    for op in seq:
        run.apply(op)
        for src in range(1, WORLD):
            msgs, nbytes = run.mb.peer_usage(src)
            assert 0 <= msgs <= PROPERTY_BOUNDS.max_msgs
            assert 0 <= nbytes <= PROPERTY_BOUNDS.max_bytes
        assert run.unaccounted() == 0
    run.apply(("tick", 1000.0))
    while run.mb.held_keys():
        run.apply(("take",))
    assert all(run.mb.peer_usage(src) == (0, 0) for src in range(1, WORLD))  # no leaked room
    assert run.fed == run.taken + run.mb.dropped


# -- the transport's keyword arguments (checked before any socket exists)

def test_the_transport_passes_its_bounds_to_the_mailbox():
    assert _peer_bounds(400, 2, 16, None, None) == PeerBounds.for_model(400, 2, 16)
    assert _peer_bounds(400, 2, 16, 7, None) == PeerBounds(7, 18 * 400)
    assert _peer_bounds(400, 2, 16, None, 1000) == PeerBounds(18, 1000)


def test_the_transport_refuses_a_byte_bound_below_one_model():
    with pytest.raises(ValueError, match=r"max_bytes_per_peer 39 .* allowed: >= 40"):
        ZmqTransport(0, 2, "tcp://127.0.0.1:0", max_numel=10, max_bytes_per_peer=39)


# -- numbering: messages a sender numbered that never arrived

def test_numbering_counts_the_gap_before_a_message():
    n = Numbering()
    assert n.note(2, 0) == 0 and n.note(2, 1) == 0
    assert n.note(2, 4) == 2          # 2 and 3 never arrived
    assert n.note(2, 5) == 0 and n.note(3, 7) == 0   # each sender apart; a first one sets it
    assert n.note(2, None) == 0       # an unnumbered message says nothing
    assert n.note(2, 0) == 0 and n.note(2, 2) == 1   # a successor counts from 0 again


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=60))
def test_numbering_counts_exactly_the_messages_removed_after_the_first(arrived):
    """Any subset of a sender's stream arrives in order: the lost count is what is missing
    between the first and the last that arrived."""
    n, seen = Numbering(), [k for k, ok in enumerate(arrived) if ok]
    lost = sum(n.note(0, k) for k in seen)
    assert lost == (seen[-1] - seen[0] + 1 - len(seen) if seen else 0)
