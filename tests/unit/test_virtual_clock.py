"""The simulator's clock: processor sharing, link queues, waits, and order independence."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu.simulator.virtual_clock import (
    Compute,
    Done,
    Mark,
    Recv,
    Send,
    VirtualClock,
    slots_for,
)


def run(programs, slots, link_model=None, order=None):
    """Report each worker's program (in the given interleaving); the emitted rows by worker."""
    rows = {r: [] for r in range(len(programs))}
    clock = VirtualClock(len(programs), link_model, slots, lambda row: rows[row["w"]].append(row))
    cursors = [0] * len(programs)
    for rank in order or [r for r, prog in enumerate(programs) for _ in prog]:
        clock.report(rank, programs[rank][cursors[rank]])
        cursors[rank] += 1
    assert clock.finished()
    return rows, clock


def msg(src, dst, rnd, nbytes=0):
    return Send((dst, src, rnd, "x"), nbytes), Recv((dst, src, rnd, "x"))


def test_busy_workers_share_the_cores():
    # 4 workers, 1 s of work each, 2 slots: all four run at half speed and finish at 2 s
    progs = [[Compute(1.0), Mark({"w": r}), Done()] for r in range(4)]
    rows, clock = run(progs, slots=2)
    assert [rows[r][0]["time_s"] for r in range(4)] == [pytest.approx(2.0)] * 4
    assert clock.now_s == pytest.approx(2.0)


def test_a_waiting_worker_leaves_its_share_to_the_others():
    # workers 0 and 1 compute 1 s; worker 2 waits for worker 0's message; 1 slot is shared by
    # the two that compute, never by the one that waits
    send, recv = msg(0, 2, 0)
    progs = [[Compute(1.0), send, Mark({"w": 0}), Done()],
             [Compute(1.0), Mark({"w": 1}), Done()],
             [recv, Compute(0.5), Mark({"w": 2}), Done()]]
    rows, _ = run(progs, slots=1)
    assert rows[0][0]["time_s"] == pytest.approx(2.0)
    assert rows[1][0]["time_s"] == pytest.approx(2.0)
    # worker 2 waited 2 s for the message, then computed alone
    assert rows[2][0]["time_s"] == pytest.approx(2.5)
    assert rows[2][0]["wait_s"] == pytest.approx(2.0)


def test_finishing_early_speeds_up_the_rest():
    # 1 slot: both run at half speed until 1 s (worker 0 has done its 0.5 s), then worker 1
    # has 0.5 s of its 1 s left and runs alone: done at 1.5 s
    progs = [[Compute(0.5), Mark({"w": 0}), Done()], [Compute(1.0), Mark({"w": 1}), Done()]]
    rows, _ = run(progs, slots=1)
    assert rows[0][0]["time_s"] == pytest.approx(1.0)
    assert rows[1][0]["time_s"] == pytest.approx(1.5)


def test_messages_queue_on_their_link_and_add_latency():
    # 1 Mbit/s, 10 ms: two 125,000-byte messages sent at once arrive at 1.01 s and 2.01 s
    model = lambda src, dst, nbytes: (nbytes * 8 / 1e6, 0.01)  # noqa: E731
    s0, r0 = msg(0, 1, 0, 125_000)
    s1, r1 = msg(0, 1, 1, 125_000)
    progs = [[s0, s1, Mark({"w": 0}), Done()],
             [r0, Mark({"w": 1}), r1, Mark({"w": 1}), Done()]]
    rows, _ = run(progs, slots=2, link_model=model)
    assert rows[0][0]["time_s"] == 0.0  # sending does not block the sender
    assert [row["time_s"] for row in rows[1]] == [pytest.approx(1.01), pytest.approx(2.01)]
    assert [row["wait_s"] for row in rows[1]] == [pytest.approx(1.01), pytest.approx(1.0)]


class _Asked:
    """A 1 Mbit/s, 10 ms link model of one protocol (``transfer``, ``at_round`` or
    ``link_timer``, never the plain call) that records what the clock asks it."""

    def __init__(self, protocol: str):
        self.calls, self.timers = [], 0
        if protocol == "transfer":
            self.transfer = self._transfer
        elif protocol == "at_round":
            self.at_round = self._at_round
        else:
            self.link_timer = self._link_timer

    def __call__(self, src, dst, nbytes):
        raise AssertionError("a model with another protocol is never called plainly")

    def _transfer(self, src, dst, nbytes, start_s, round_idx):
        self.calls.append((src, dst, nbytes, start_s, round_idx))
        return nbytes * 8 / 1e6, 0.01

    def _at_round(self, src, dst, nbytes, round_idx, now_s):
        self.calls.append((src, dst, nbytes, now_s, round_idx))
        return nbytes * 8 / 1e6, 0.01

    def _link_timer(self, src, dst):
        self.timers += 1
        return lambda nbytes, start_s, round_idx: self._transfer(src, dst, nbytes, start_s,
                                                                 round_idx)


@pytest.mark.parametrize("protocol", ["transfer", "at_round", "link_timer"])
def test_each_link_model_protocol_gets_what_it_is_owed(protocol):
    """``transfer`` and a link's timer get the time the message starts on its link (after
    the queue) and its round; ``at_round`` the round and the send time; a link's timer is
    asked for once. Each times the two queued messages alike."""
    model = _Asked(protocol)
    s0, r0 = msg(0, 1, 0, 125_000)
    s1, r1 = msg(0, 1, 1, 125_000)
    progs = [[s0, s1, Mark({"w": 0}), Done()],
             [r0, Mark({"w": 1}), r1, Mark({"w": 1}), Done()]]
    rows, clock = run(progs, slots=2, link_model=model)
    assert [row["time_s"] for row in rows[1]] == [pytest.approx(1.01), pytest.approx(2.01)]
    second_at = 0.0 if protocol == "at_round" else 1.0
    assert model.calls == [(0, 1, 125_000, 0.0, 0), (0, 1, 125_000, second_at, 1)]
    assert model.timers == (1 if protocol == "link_timer" else 0)
    assert clock.link_busy_s == {(0, 1): 2.0}


def test_comm_s_counts_from_the_end_of_compute():
    model = lambda src, dst, nbytes: (0.0, 0.25)  # noqa: E731
    s, r = msg(1, 0, 0)
    progs = [[Compute(1.0), r, Mark({"w": 0}), Done()], [s, Mark({"w": 1}), Done()]]
    rows, _ = run(progs, slots=2, link_model=model)
    assert rows[0][0]["time_s"] == pytest.approx(1.0)  # the message arrived at 0.25 s
    assert rows[0][0]["comm_s"] == pytest.approx(0.0)
    assert rows[0][0]["wait_s"] == 0.0


def ring_programs(n, rounds, work, nbytes):
    """Each round: compute, send to the next worker, wait for the previous one, end the round."""
    progs = [[] for _ in range(n)]
    for t in range(rounds):
        for r in range(n):
            send, _ = msg(r, (r + 1) % n, t, nbytes)
            _, recv = msg((r - 1) % n, r, t, nbytes)
            progs[r] += [Compute(work[t][r]), send, recv, Mark({"w": r, "round": t})]
    for prog in progs:
        prog.append(Done())
    return progs


def reference_ring(n, rounds, work, nbytes, model):
    """Max-plus recursion for the ring with cores to spare (no sharing): the textbook answer."""
    clock, free, times = [0.0] * n, {}, []
    for t in range(rounds):
        done = [clock[r] + work[t][r] for r in range(n)]
        arrive = {}
        for r in range(n):
            wire, lat = model(r, (r + 1) % n, nbytes)
            start = max(done[r], free.get(r, 0.0))
            free[r] = start + wire
            arrive[(r + 1) % n] = start + wire + lat
        clock = [max(done[r], arrive[r]) for r in range(n)]
        times.append(list(clock))
    return times


def random_interleaving(programs, rng):
    left = [len(p) for p in programs]
    order = []
    while any(left):
        rank = rng.choice([r for r, k in enumerate(left) if k])
        order.append(rank)
        left[rank] -= 1
    return order


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 6), rounds=st.integers(1, 4), seed=st.integers(0, 10**6))
def test_ring_matches_the_max_plus_reference_in_any_report_order(n, rounds, seed):
    rng = random.Random(seed)
    work = [[rng.uniform(0.1, 2.0) for _ in range(n)] for _ in range(rounds)]
    rates = {r: rng.choice([1e6, 5e6, 50e6]) for r in range(n)}
    model = lambda src, dst, nbytes: (nbytes * 8 / rates[src], 0.002)  # noqa: E731
    progs = ring_programs(n, rounds, work, 400_000)
    rows, _ = run(progs, slots=n, link_model=model, order=random_interleaving(progs, rng))
    expected = reference_ring(n, rounds, work, 400_000, model)
    for r in range(n):
        assert [row["time_s"] for row in rows[r]] == pytest.approx([e[r] for e in expected])


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 6), slots=st.sampled_from([0.5, 1.0, 2.0, 3.0]),
       seed=st.integers(0, 10**6))
def test_report_order_does_not_change_any_time(n, slots, seed):
    # the threads report in whatever order they happen to run; the replay must not care
    rng = random.Random(seed)
    work = [[rng.uniform(0.1, 2.0) for _ in range(n)] for _ in range(3)]
    model = lambda src, dst, nbytes: (nbytes * 8 / 5e6, 0.001)  # noqa: E731
    progs = ring_programs(n, 3, work, 200_000)
    a, _ = run(progs, slots, model, order=random_interleaving(progs, rng))
    b, _ = run(progs, slots, model, order=random_interleaving(progs, rng))
    for r in range(n):
        assert [row["time_s"] for row in a[r]] == pytest.approx([row["time_s"] for row in b[r]])


def reference_sharing(works, slots):
    """Finish times of jobs that start together under processor sharing, shortest first."""
    now, done, left = 0.0, {}, dict(enumerate(works))
    while left:
        rate = min(1.0, slots / len(left))
        first = min(left, key=left.get)
        dt = left[first] / rate
        now += dt
        left = {j: w - rate * dt for j, w in left.items() if j != first}
        done[first] = now
    return [done[j] for j in range(len(works))]


@settings(max_examples=40, deadline=None)
@given(works=st.lists(st.floats(0.05, 3.0), min_size=1, max_size=8),
       slots=st.sampled_from([0.5, 1.0, 2.0, 3.0, 8.0]))
def test_sharing_matches_the_processor_sharing_reference(works, slots):
    progs = [[Compute(w), Mark({"w": r}), Done()] for r, w in enumerate(works)]
    rows, clock = run(progs, slots)
    assert [rows[r][0]["time_s"] for r in range(len(works))] == \
        pytest.approx(reference_sharing(works, slots))
    assert clock.now_s == pytest.approx(max(reference_sharing(works, slots)))


def test_rows_of_a_failed_run_have_no_times():
    send, recv = msg(0, 1, 0)
    clock = VirtualClock(2, None, 2)
    clock.report(1, recv)
    clock.report(1, Mark({"w": 1}))  # worker 0 never sends: worker 1's round never settles
    assert clock.unsettled_rows() == [{"w": 1, "time_s": None, "comm_s": None, "wait_s": None}]


def test_slots_validation_and_helper():
    with pytest.raises(ValueError, match="slots"):
        VirtualClock(2, None, 0)
    assert slots_for(2, 1) == 2.0 and slots_for(16, 4) == 4.0 and slots_for(0, 0) == 1.0
