"""The virtual clock's dedicated computes: nominal step times run on each worker's own device."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu.simulator.virtual_clock import Compute, Done, Mark, Recv, Send, VirtualClock


def run(programs, slots, link_model=None):
    rows = {r: [] for r in range(len(programs))}
    clock = VirtualClock(len(programs), link_model, slots, lambda row: rows[row["w"]].append(row))
    for rank, prog in enumerate(programs):
        for op in prog:
            clock.report(rank, op)
    assert clock.finished()
    return rows, clock


def test_dedicated_computes_are_not_shared():
    # 4 workers, 1 s each, 1 slot: shared they would end at 4 s; dedicated each ends at 1 s
    progs = [[Compute(1.0, dedicated=True), Mark({"w": r}), Done()] for r in range(4)]
    rows, clock = run(progs, slots=1)
    assert [rows[r][0]["time_s"] for r in range(4)] == [1.0] * 4
    assert clock.now_s == 1.0


def test_a_dedicated_compute_takes_no_share_from_a_measured_one():
    # 1 slot: the measured compute has it to itself although another worker computes
    progs = [[Compute(2.0, dedicated=True), Mark({"w": 0}), Done()],
             [Compute(1.0), Mark({"w": 1}), Done()],
             [Compute(1.0), Mark({"w": 2}), Done()]]
    rows, _ = run(progs, slots=1)
    assert rows[0][0]["time_s"] == 2.0
    assert rows[1][0]["time_s"] == pytest.approx(2.0) and rows[2][0]["time_s"] == \
        pytest.approx(2.0)  # the two measured ones share the slot


def test_the_issue_example_diloco_waits_for_the_straggler():
    # 4 workers, 10 steps of 0.05 s, worker 3 at speed 0.25; a ring exchange each round over
    # instant links: every round lasts worker 3's 2 s, so 4 rounds take 8 s
    n, rounds, progs = 4, 4, [[] for _ in range(4)]
    for t in range(rounds):
        for r in range(n):
            work = 10 * 0.05 / (0.25 if r == 3 else 1.0)
            key_out, key_in = ((r + 1) % n, r, t, "x"), (r, (r - 1) % n, t, "x")
            progs[r] += [Compute(work, dedicated=True), Send(key_out, 1000), Recv(key_in),
                         Mark({"w": r, "round": t})]
    for prog in progs:
        prog.append(Done())
    rows, clock = run(progs, slots=0.5)  # dedicated: however few cores the host has
    assert clock.now_s == pytest.approx(8.0)
    assert [row["wait_s"] for row in rows[0]] == pytest.approx([1.5] * 4)
    assert [row["wait_s"] for row in rows[3]] == [0.0] * 4


@settings(max_examples=40, deadline=None)
@given(works=st.lists(st.tuples(st.floats(0.05, 3.0), st.booleans()), min_size=1, max_size=8),
       slots=st.sampled_from([0.5, 1.0, 2.0]))
def test_dedicated_end_times_are_their_work_whatever_else_computes(works, slots):
    progs = [[Compute(w, dedicated=d), Mark({"w": r}), Done()] for r, (w, d) in enumerate(works)]
    rows, _ = run(progs, slots)
    for r, (w, d) in enumerate(works):
        if d:
            assert rows[r][0]["time_s"] == pytest.approx(w)
        else:
            assert rows[r][0]["time_s"] >= w * (1 - 1e-9)
