"""A host lost without warning (``scenario.hostloss``): node 0's typed decision, the round it is
fixed at, what it does to every worker's rounds (``World.lose``), how a lost peer's message is
done without (``gossip_mix``) and counted, and the wire forms that carry it. The whole path
across emulated hosts is tests/net/test_multinode.py's killed-host test."""
from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest
import torch

from gasloc_emu import config
from gasloc_emu.algorithms import registry
from gasloc_emu.algorithms.base import gossip_mix
from gasloc_emu.emulator.errors import RunFailed
from gasloc_emu.scenario.fixing import RoundFixer
from gasloc_emu.scenario.hostloss import (
    HostBack,
    HostLoss,
    HostLossError,
    in_decided_order,
    sent_to_dead,
)
from gasloc_emu.scenario.script import Scenario
from gasloc_emu.scenario.world import World, ring_peers
from gasloc_emu.transport import control, orders
from gasloc_emu.transport.base import PeerLost
from gasloc_emu.transport.control import ControlError, Expect

LOSS = HostLoss(node=2, host="h2", ranks=(4, 3), round=6, at_s=5.25, last_rows={3: 3, 4: 4})
BACK = HostBack(node=2, host="h2", ranks=(4, 3), round=9, at_s=8.5)   # the same host, back


def test_a_host_loss_round_trips_through_json_and_sorts_its_ranks():
    assert LOSS.ranks == (3, 4)
    assert HostLoss.from_json(LOSS.to_json()) == LOSS
    assert LOSS.dead_from(3) == 4 and LOSS.dead_from(4) == 5 and LOSS.dead_from(0) is None


@pytest.mark.parametrize("change, words", [
    ({"version": 2}, "version 2"),
    ({"ranks": []}, "at least one worker"),
    ({"round": -1}, "round >= 0"),
    ({"last_rows": {"3": 6, "4": 4}}, "in [-1, 6)"),     # a row at the loss's round or later
    ({"last_rows": {"3": 3}}, "must give each of workers [3, 4]"),
    ({"at_s": "soon"}, "time >= 0"),
    ({"extra": 1}, "not a host loss"),
])
def test_a_malformed_host_loss_is_refused_naming_what(change, words):
    with pytest.raises(HostLossError, match=re.escape(words)):
        HostLoss.from_json(LOSS.to_json() | change)


def test_a_loss_of_workers_the_run_does_not_have_is_refused():
    with pytest.raises(HostLossError, match=r"workers \[4\]: the run has 4"):
        LOSS.check(workers=4, rounds=10)


def test_a_loss_is_fixed_one_round_after_the_highest_started_and_orders_later_events():
    fixer = RoundFixer(Scenario((), 4, 20))
    for t in (0, 3, 2):
        fixer.started(t)
    assert fixer.fixed_unplanned(1.5) == 4
    assert fixer.round_at(1.5) == 4      # another event at the same time shares its round
    assert fixer.round_at(1.6) == 5      # a later one comes after it, even with no new start


def world(workers=6, rounds=12, armed=True, peers=ring_peers) -> World:
    return World(Scenario((), workers, rounds, "no scenario"), workers, rounds, 2.0, peers,
                 armed=armed)


def test_the_lost_workers_take_part_until_the_loss_and_leave_at_its_round():
    w = world()
    assert w.fixer is not None and w.reshapes   # every worker asks at its round starts
    assert w.lose(LOSS) and not w.lose(LOSS)    # once: the decision may come twice
    assert w.alive(5) == frozenset(range(6)) and w.alive(6) == frozenset({0, 1, 2, 5})
    assert [t for t in range(12) if w.dead_in(3, t)] == list(range(4, 12))
    assert [t for t in range(12) if w.dead_in(4, t)] == list(range(5, 12))
    assert not any(w.dead_in(0, t) for t in range(12))
    plan = w.plan(2, 6)
    assert plan.detect_s == 2.0 and not plan.leaving   # 2 was 3's ring neighbour in round 5
    assert w.plan(3, 6).leaving
    # DiLoCo's ring re-forms over the survivors from the loss's round
    assert w.ring_members(0)(6) == frozenset({0, 1, 2, 5}) and w.peers(2, 6) == [1, 5]
    assert w.left_and_joined() == [
        {"type": "leave", "worker": r, "round": 6, "at_s": 5.25, "reason": "host lost",
         "node": 2} for r in (3, 4)]


def test_a_loss_at_a_round_past_the_end_never_fires():
    w = world(rounds=6)
    w.lose(LOSS)
    assert w.alive(5) == frozenset(range(6)) and w.left_and_joined() == []


def test_a_world_that_does_not_go_on_refuses_a_loss():
    with pytest.raises(ValueError, match="on_worker_loss"):
        world(armed=False).lose(LOSS)


def test_messages_to_the_dead_are_counted_for_each_round_they_were_members_but_dead():
    # ring of 6: 3 dies in round 4 (last row 3), 4 in round 5 (last row 4), both leave at 6;
    # gossip: survivors 2 (3's neighbour) and 5 (4's) sent one message a round to them
    w = world(peers=lambda rank, t, alive, cut=frozenset(): ring_peers(rank, t, alive, cut))
    w.lose(LOSS)
    assert sent_to_dead(LOSS, 12, w.sends, w.alive) == {2: 2, 5: 1}
    assert w.sent_to_dead() == {2: 2, 5: 1}
    assert sent_to_dead(LOSS, 5, w.sends, w.alive) == {2: 1}   # the run ends first


def test_a_ring_counts_what_the_worker_before_the_dead_sent_them():
    """DiLoCo's ring All-Reduce over 6: worker 2 sends 2(6 - 1) chunks a round to 3, its next
    on the ring (rounds 4 and 5); 5 sends to 0, not to 4 (before it on the ring)."""
    w = world()
    w.lose(LOSS)
    assert w.sends(2, 3, 4) == 10 and w.sends(3, 2, 4) == 0 and w.sends(5, 4, 5) == 0
    assert w.sent_to_dead() == {2: 20}


class Row:
    """A topology's row of one worker: its peers and Metropolis–Hastings weights."""

    def __init__(self, weights: dict[int, float]):
        self.weights = weights

    def peers(self, rank, t):
        return sorted(self.weights)

    def row(self, rank, t):
        return 1.0 - sum(self.weights.values()), self.weights


class Mail:
    """A transport that has some peers' messages; the others are lost with their host."""

    def __init__(self, have: dict[int, torch.Tensor]):
        self.have, self.lost = have, []

    def recv(self, peer, round_idx, kind):
        if peer not in self.have:
            self.lost.append(peer)
            raise PeerLost(0, peer, round_idx, kind)
        return self.have[peer]


def test_a_message_lost_with_its_host_is_replaced_by_the_receivers_own_value():
    z = torch.tensor([1.0, 2.0])
    one, lost = torch.tensor([3.0, 5.0]), torch.tensor([100.0, 100.0])
    out = torch.empty(2)
    gossip_mix(Mail({1: one}), Row({1: 0.25, 2: 0.25}), 0, 3, z, out)
    assert torch.equal(out, 0.75 * z + 0.25 * one)   # the lost peer's weight is the self's
    out_all = torch.empty(2)
    gossip_mix(Mail({1: one, 2: lost}), Row({1: 0.25, 2: 0.25}), 0, 3, z, out_all)
    assert not torch.equal(out, out_all)             # with the message, it is mixed in


def test_gossip_and_diloco_go_on_after_a_lost_host_and_compression_says_why_not():
    cfg = config.resolve(overrides={"workers": 4})
    assert registry.load("gasloc").host_loss_refusal(cfg) is None
    assert registry.load("diloco").host_loss_refusal(cfg) is None
    int8 = config.resolve(overrides={"workers": 4}, sets=("comm.codec=int8",))
    assert "public copy" in registry.load("gasloc").host_loss_refusal(int8)
    assert "error-feedback residual" in registry.load("diloco").host_loss_refusal(int8)


def test_the_decision_travels_as_a_typed_order():
    wire = orders.Lost(LOSS.to_json()).to_wire()
    parsed = orders.parse_order(wire)
    assert isinstance(parsed, orders.Lost) and HostLoss.from_json(parsed.loss) == LOSS
    with pytest.raises(orders.OrderError):
        orders.parse_order({"type": "lost", "loss": [1]})
    back = orders.parse_order(orders.Back(BACK.to_json()).to_wire())
    assert isinstance(back, orders.Back) and HostBack.from_json(back.back) == BACK
    with pytest.raises(orders.OrderError):
        orders.parse_order({"type": "back", "back": "soon"})


EXPECT = Expect(workers=4, rounds=5, numel=6)
ROW = {"worker": 1, "round": 2, "step": 30, "train_loss": 3.5, "compute_s": 0.25, "comm_s": 0.5,
       "wait_s": 0.125, "bytes_sent": 1000, "bytes_recv": 900, "peers": [0, 2], "time_s": 7.5,
       "dropped": 1}


def test_a_row_says_which_messages_its_worker_did_without():
    row = ROW | {"dead_peer": [[3, 2, "z"]]}
    assert control.parse({"type": "metric", "worker": 1, "row": row}, EXPECT).row == row


@pytest.mark.parametrize("bad", [[], [[3, 2]], [[4, 2, "z"]], [[3, 5, "z"]], [[3, 2, 7]],
                                 [[3, 2, "z"]] * 9, [[3, 2, ""]]])
def test_a_malformed_dead_peer_list_is_refused(bad):
    with pytest.raises(ControlError) as info:
        control.parse({"type": "metric", "worker": 1, "row": ROW | {"dead_peer": bad}}, EXPECT)
    assert info.value.reason == "metric.row.dead_peer"


# ---------------------------------------------------------------- node 0's decision


def shell(algo: str, on_loss: str = "continue", dead_rows=(3, 3, 4), sets=()):
    """Node 0's ``ClusterSupervisor`` without sockets or processes: three hosts of 1 + 2 + 3
    workers, the run's clock at 5.25 s, every worker started up to round 5 (they asked for
    the fixings), node 2's workers' last rows ``dead_rows``; what it tells each worker goes
    to ``told``."""
    from gasloc_emu.cluster.multinode import ClusterSupervisor
    from gasloc_emu.emulator.conductor import Conductor
    from gasloc_emu.plan import build_plan
    cfg = config.resolve(overrides={"workers": 6, "run.rounds": 12}, sets=(
        f"algo.name={algo}", f"run.on_worker_loss={on_loss}", "topology.name=ring", *sets))
    plan = build_plan(cfg, data=False)
    sup = object.__new__(ClusterSupervisor)
    sup.plan, sup.cfg, sup.t0, sup.progress, sup.lost_nodes = plan, cfg, 1.0, None, set()
    sup.told = []
    sup._tell = lambda rank, msg: sup.told.append((rank, msg))
    sup.scenario = Conductor(plan.world, None, 12, lambda: 5.25, sup._tell)
    if plan.world is not None:
        for t in range(6):
            plan.world.fixer.started(t)
    rows = [5, 5, 5, *dead_rows]
    sup.slots = [SimpleNamespace(rank=r, gone=False, round=rows[r], final=None, killed=[],
                                 heartbeat=None, rows_dead_peer=0,
                                 ready={"addr": f"tcp://198.18.0.{r}:5000"}) for r in range(6)]
    infos = [SimpleNamespace(node=k, host=f"h{k}", workers=k + 1) for k in range(3)]
    sup.node = SimpleNamespace(infos=infos, node_of=lambda r: infos[(r > 0) + (r > 2)])
    sup._serve = lambda timeout_s: None
    return sup, sup.node.infos[2]


def test_node_0_decides_the_round_of_a_lost_host_and_tells_every_survivor_first():
    sup, lost = shell("gasloc")
    assert sup._goes_on_without(lost) and not sup._goes_on_without(sup.node.infos[0])
    sup.slots[4].heartbeat = SimpleNamespace(sent={3: 10}, drop_reasons={"zap.user": 1})
    sup.slots[1].ready = None   # a successor starting now: told every decision at its start
    sup._lose_node(lost)
    # what the dead processes' counters had is kept as their heartbeats and rows said
    assert [s.killed[0]["drop_reasons"] for s in sup.slots[3:]] == [{}, {"zap.user": 1}, {}]
    loss = HostLoss(2, "h2", (3, 4, 5), 6, 5.25, {3: 3, 4: 3, 5: 4})
    assert sup.plan.world.losses == [loss] and sup.lost_nodes == {2}
    assert [s.gone for s in sup.slots] == [False] * 3 + [True] * 3
    assert sup.told == [(r, orders.Lost(loss.to_json()).to_wire()) for r in (0, 2)]
    assert sup.plan.world.alive(6) == frozenset({0, 1, 2})


def test_diloco_goes_on_after_a_lost_host_and_its_survivors_merge_at_the_loss_round():
    sup, lost = shell("diloco")
    sup._lose_node(lost)
    world = sup.plan.world
    assert [r for r, _ in sup.told] == [0, 1, 2] and world.alive(6) == frozenset({0, 1, 2})
    assert world.heals(6) and not world.heals(5) and not world.heals(7)


def test_compressed_diloco_ends_the_run_naming_why_it_cannot_go_on():
    sup, lost = shell("diloco", sets=("comm.codec=int8",))
    with pytest.raises(RunFailed, match=r"node 2 \(h2, workers \[3, 4, 5\]\) lost; the run "
                                        r"cannot go on without them: diloco: comm.codec"):
        sup._lose_node(lost)
    assert sup.told == []


def test_a_lost_host_fails_the_run_by_default_and_when_no_worker_is_left():
    sup, lost = shell("gasloc", on_loss="auto")
    assert not sup._goes_on_without(lost)   # the run fails naming the silent node, as before
    sup, lost = shell("gasloc")
    for s in sup.slots[:3]:
        s.gone = True
    with pytest.raises(RunFailed, match="no worker is left on any other node"):
        sup._lose_node(lost)



@pytest.mark.parametrize("sets, what", [(("algo.name=a2cid2",), "algo.name = a2cid2"),
                                        (("algo.overlap=1",), "algo.overlap = 1")])
def test_going_on_after_a_lost_host_is_refused_where_leaves_are(sets, what):
    from gasloc_emu.plan import build_plan
    cfg = config.resolve(overrides={"workers": 4}, sets=(*sets, "run.on_worker_loss=continue"))
    with pytest.raises(config.ConfigError, match=f"run.on_worker_loss = 'continue' .* {what}"):
        build_plan(cfg, data=False)


def test_a_worker_killed_while_its_host_lives_is_lost_alone_when_the_run_goes_on():
    """One worker process killed by a signal (its node agent lives): lost as a host of that one
    worker (``cause = worker``); an error exit, or the default setting, still fails the run."""
    sup, _ = shell("diloco")
    assert sup._survives_death(-9) and not sup._survives_death(1)
    sup._lose_worker(sup.slots[4], -9)
    loss = HostLoss(2, "h2", (4,), 6, 5.25, {4: 3}, cause="worker")
    assert sup.plan.world.losses == [loss] and [s.gone for s in sup.slots] == \
        [False] * 4 + [True, False]
    assert sup.told == [(r, orders.Lost(loss.to_json()).to_wire()) for r in (0, 1, 2, 3, 5)]
    assert sup.plan.world.left_and_joined() == [
        {"type": "leave", "worker": 4, "round": 6, "at_s": 5.25, "reason": "worker lost",
         "node": 2}]
    for on_loss in ("auto", "fail"):
        assert not shell("diloco", on_loss=on_loss)[0]._survives_death(-9)


def test_a_loss_says_its_cause_only_when_one_worker_was_killed():
    worker = HostLoss(0, "h0", (2,), 3, 1.0, {2: 1}, cause="worker")
    assert HostLoss.from_json(worker.to_json()) == worker and worker.reason == "worker lost"
    assert "cause" not in LOSS.to_json() and LOSS.reason == "host lost"
    with pytest.raises(HostLossError, match="a worker cause loses one worker"):
        HostLoss(0, "h0", (2, 3), 3, 1.0, {2: 1, 3: 1}, cause="worker")
    with pytest.raises(HostLossError, match="cause 'fire'"):
        HostLoss.from_json(LOSS.to_json() | {"cause": "fire"})


def test_a_row_says_its_round_was_not_committed_and_only_with_true():
    row = ROW | {"uncommitted": True}
    assert control.parse({"type": "metric", "worker": 1, "row": row}, EXPECT).row == row
    with pytest.raises(ControlError) as info:
        control.parse({"type": "metric", "worker": 1, "row": ROW | {"uncommitted": False}},
                      EXPECT)
    assert info.value.reason == "metric.row.uncommitted"


# ---------------------------------------------------------------- DiLoCo's ring after a loss

RING_KINDS = [f"{phase}{s}" for phase in ("rs", "ag") for s in range(3)]   # a ring of 4


def _means(dead: set) -> dict:
    """Every worker's ring All-Reduce mean of round 0 over 4 workers on an in-memory hub whose
    messages ``dead`` (dst, src, round, kind) are lost with worker 3's host; {rank: (mean,
    what its transport did without)}."""
    from hub_threads import on_threads

    from gasloc_emu.transport.base import ring_all_reduce_sum
    inputs = [torch.arange(10, dtype=torch.float64) * (r + 1) for r in range(4)]

    def body(rank, tp):
        mean = ring_all_reduce_sum(tp, 0, inputs[rank].clone()).div_(4)
        return mean, list(tp.dead_peer_losses)
    return on_threads(4, body, frozenset(dead)) | {"exact": sum(inputs) / 4}


def test_a_chunk_lost_with_a_dead_peer_is_a_gap_every_mean_it_reaches_holds():
    """Worker 3 died before sending anything to 0, its next on the ring: 0 does without its
    six chunks, the ring goes on (nobody waits for a living worker that gave up, and the dead
    worker's replay gets every message it waits for), and the gap (NaN) reaches every
    survivor's mean, so none commits the round."""
    from gasloc_emu.transport.base import gap_free
    out = _means({(0, 3, 0, kind) for kind in RING_KINDS})
    assert out[0][1] == [(3, 0, kind) for kind in RING_KINDS]
    assert not any(gap_free(out[r][0]) for r in (0, 1, 2))


def test_a_worker_killed_before_its_last_send_leaves_the_gap_with_the_next_alone():
    """Killed between its last two all-gather sends: its next worker lacks one chunk, the
    others have the whole mean (so survivors can differ on whether the round is whole)."""
    from gasloc_emu.transport.base import gap_free
    out = _means({(0, 3, 0, "ag2")})
    assert not gap_free(out[0][0]) and out[0][1] == [(3, 0, "ag2")]
    for r in (1, 2):
        assert gap_free(out[r][0]) and torch.allclose(out[r][0], out["exact"])
        assert torch.equal(out[r][0], out[1][0])


def test_diloco_does_not_commit_a_round_with_a_gap_and_its_survivors_merge_at_the_loss():
    """Worker 3 (its own host) is killed between its last two sends of round 0; node 0 fixes
    its leave at round 1. Worker 0 (the gap) does not commit round 0: anchor and momentum stay
    and theta goes back to the anchor (torchft's failed commit); 1 and 2 take the step. In
    round 1 the ring is 0, 1, 2: they first merge their states (the world's ``heals``), so all
    three end with the same bits."""
    from hub_threads import on_threads

    from gasloc_emu.algorithms.diloco import DiLoCo
    w = world(workers=4, rounds=3)
    w.lose(HostLoss(3, "h3", (3,), 1, 2.0, {3: -1}))
    start = torch.zeros(6, dtype=torch.float64)

    def body(rank, tp):
        algo = DiLoCo(rank, tp, 0.7, 0.9, members=w.ring_members(rank), heals=w.heals,
                      survives_loss=True)
        theta = start.clone()
        algo.begin(theta)
        seen = []
        for t in range(1 if rank == 3 else 2):   # 3 is the dead worker's replay: round 0
            theta.add_(torch.full_like(theta, 0.1 * (rank + 1) * (t + 1)))   # its inner steps
            algo.outer_step(t, theta)
            seen.append((algo.uncommitted, algo.anchor.clone(), theta.clone(),
                         None if algo.buf is None else algo.buf.clone()))
        return seen
    out = on_threads(4, body, frozenset({(0, 3, 0, "ag2")}))
    assert out[0][0][0] and torch.equal(out[0][0][1], start) and torch.equal(out[0][0][2], start)
    assert out[0][0][3] is None
    for r in (1, 2):
        assert not out[r][0][0] and not torch.equal(out[r][0][1], start)
    for r in (1, 2):   # after round 1 (merge, then the survivors' step): one state
        assert not out[r][1][0] and torch.equal(out[r][1][1], out[0][1][1])
        assert torch.equal(out[r][1][3], out[0][1][3]) and torch.equal(out[r][1][2], out[r][1][1])


def test_the_summary_lists_the_rounds_not_committed(tmp_path):
    """A run whose rows say some rounds were not committed cannot pass for an undisturbed one:
    its summary lists them by worker; one without any has no such key."""
    import json

    from gasloc_emu.report.records import RunRecord
    from gasloc_emu.report.schema import MetricRow, RunSummary
    cfg = config.resolve(overrides={"workers": 4})
    for folder, flagged in ((tmp_path / "lost", {(0, 2), (2, 3), (0, 3)}), (tmp_path / "ok", ())):
        with RunRecord(folder, cfg) as rec:
            for w, t in [(0, 2), (1, 2), (2, 2), (0, 3), (2, 3)]:
                flag = {"uncommitted": True} if (w, t) in flagged else {}
                rec.metric(MetricRow.from_round(ROW | {"worker": w, "round": t} | flag))
            rec.summary(RunSummary.ended("stopped", "interrupted", mode="run"))
    lost = json.loads((tmp_path / "lost" / "summary.json").read_text())
    assert lost["uncommitted"] == {"total": 3, "by_worker": {"0": [2, 3], "2": [3]}}
    assert "uncommitted" not in json.loads((tmp_path / "ok" / "summary.json").read_text())


def test_node_0_loses_a_worker_its_node_agent_saw_killed_and_fails_on_an_error_exit():
    """A node agent's beat says its worker 4 died (signal 9) while the agent lives: node 0
    loses that worker alone and goes on; an error exit still ends the run naming it."""
    def beat(code):
        return SimpleNamespace(status=lambda node: SimpleNamespace(dead={4: code}, lives={}),
                               silent_s=lambda node, now: 0.0)
    sup, host = shell("diloco")
    sup.lives = [0] * 6
    sup._check_node(host, beat(-9), 0.0)
    assert [(x.ranks, x.cause) for x in sup.plan.world.losses] == [((4,), "worker")]
    assert [r for r, _ in sup.told] == [0, 1, 2, 3, 5] and sup.slots[4].gone
    sup, host = shell("diloco")
    sup.lives = [0] * 6
    sup._when = lambda s: "in round 3"
    with pytest.raises(RunFailed, match=r"worker 4 died \(exit code 1\) in round 3"):
        sup._check_node(host, beat(1), 0.0)


# -- a lost host that comes back



def test_a_host_back_round_trips_through_json_and_is_refused_when_malformed():
    assert BACK.ranks == (3, 4) and HostBack.from_json(BACK.to_json()) == BACK
    for change, words in [({"version": 2}, "version 2"), ({"ranks": [3, 3]}, "distinct"),
                          ({"round": -1}, "round >= 0"), ({"from_checkpoint": 1}, "true or"),
                          ({"extra": 1}, "not a host back")]:
        with pytest.raises(HostLossError, match=re.escape(words)):
            HostBack.from_json(BACK.to_json() | change)


def test_lost_workers_come_back_at_the_round_decided_from_a_neighbour_and_are_dead_between():
    w = world(rounds=14)
    w.lose(LOSS)
    assert w.back(BACK) and not w.back(BACK)   # once: the decision may come twice
    assert w.alive(8) == frozenset({0, 1, 2, 5}) and w.alive(9) == frozenset(range(6))
    assert [t for t in range(14) if w.dead_in(3, t)] == [4, 5, 6, 7, 8]
    assert [t for t in range(14) if w.dead_in(4, t)] == [5, 6, 7, 8]
    plan = w.plan(3, 9)
    # no graph here: the lowest-ranked living worker gives each its parameters
    assert plan.join_from == 0 and plan.joined == frozenset({3, 4})
    assert w.plan(0, 9).donate_to == (3, 4) and not w.plan(3, 9).donate_to
    assert [c for c in w.left_and_joined() if c["type"] == "join"] == [
        {"type": "join", "worker": r, "round": 9, "at_s": 8.5,
         "reason": "host back", "node": 2} for r in (3, 4)]
    assert w.ring_members(0)(9) == frozenset(range(6))
    # lost again later: dead from the round after its last row since the return
    again = HostLoss(2, "h2", (3, 4), 12, 11.0, {3: 10, 4: 10})
    w.lose(again)
    assert [t for t in range(14) if w.dead_in(3, t)] == [4, 5, 6, 7, 8, 11, 12, 13]


@pytest.mark.parametrize("back, words", [
    (HostBack(2, "h2", (3, 4), 6, 8.5), "not lost then"),            # at the loss's round
    (HostBack(2, "h2", (3, 4, 5), 9, 8.5), "worker 5 at round 9"),   # 5 was never lost
    (HostBack(2, "h2", (3, 9), 9, 8.5), "the run has 6"),
])
def test_a_return_of_workers_that_are_not_lost_is_refused(back, words):
    w = world(rounds=14)
    w.lose(LOSS)
    with pytest.raises(HostLossError, match=re.escape(words)):
        w.back(back)


def test_a_worker_back_twice_without_a_loss_between_is_refused():
    w = world(rounds=14)
    w.lose(LOSS)
    w.back(BACK)
    with pytest.raises(HostLossError, match="not lost then"):
        w.back(HostBack(2, "h2", (3, 4), 11, 10.0))


def test_node_0_takes_a_lost_node_back_and_tells_the_living_then_the_returners_everything():
    """Node 0's side: the node's agent asks again with the same settings; its workers join at
    the round after the highest started, the others hear of it at once, and each returner's
    start carries every decision so far (the loss, then the return) before the peers."""
    from gasloc_emu.cluster.rendezvous import BackOrder, Holdings, NodeInfo
    sup, lost = shell("gasloc")
    sup._lose_node(lost)
    sup.told.clear()
    for s in sup.slots:
        s.ready = {"addr": f"tcp://198.18.0.{s.rank}:5000"}
    sup.lives, sup.answered = [0] * 6, set()
    sup.addrs = {s.rank: s.ready["addr"] for s in sup.slots}   # as the start gave them
    sup.slots[3].ready = None   # its restart was ordered on the dead host: never ready
    info = NodeInfo(2, "h2", "198.18.0.3", 3, ("cpu",) * 3, ("cpu",) * 3, "hash", {}, "v", "",
                    5000, pid=77)
    ref = dataclasses.replace(info, node=0, workers=1, devices=("cpu",), labels=("cpu",))
    sup.node.infos = [ref, sup.node.infos[1], info]
    answers = []
    rdv = SimpleNamespace(back_request=lambda node: info, seen={2: (5, 0.0)},
                          answer_back=answers.append,
                          back_holdings=lambda node, pid: Holdings(1, 2, {3: (), 4: (), 5: ()}))
    sup.plan.world.fixer.started(6)
    sup._check_back(info, rdv)
    sup._check_back(info, rdv)   # the same request is answered once
    back = HostBack(2, "h2", (3, 4, 5), 7, 5.25)
    assert sup.plan.world.backs == [back] and sup.lost_nodes == set() and 2 not in rdv.seen
    assert answers == [BackOrder(1, 2, 77, 7, {3: 1, 4: 1, 5: 1},
                                 {r: f"tcp://198.18.0.{r}:5000" for r in (3, 4, 5)})]
    assert sup.told == [(r, orders.Back(back.to_json()).to_wire()) for r in (0, 1, 2)]
    assert [s.gone or s.ready is not None for s in sup.slots] == [True] * 3 + [False] * 3
    sup.told.clear()
    sup._tell_start(3)
    assert [m["type"] for _, m in sup.told] == ["lost", "back", "start"]
    start = orders.parse_order(sup.told[-1][1])
    assert start.peers == {r: f"tcp://198.18.0.{r}:5000" for r in range(6)}   # returners too


def test_node_0_refuses_a_node_back_with_other_settings_or_no_round_left():
    from gasloc_emu.cluster.rendezvous import NodeInfo
    sup, lost = shell("gasloc")
    sup._lose_node(lost)
    sup.scenario.clock = lambda: 6.0
    for s in sup.slots:
        s.ready = {"addr": "tcp://a:1"}
    info = NodeInfo(2, "h2", "198.18.0.3", 3, ("cpu",) * 3, ("cpu",) * 3, "hash", {}, "v", "",
                    5000)
    sup.node.infos = [dataclasses.replace(info, node=0, workers=1, devices=("cpu",),
                                          labels=("cpu",)),
                      sup.node.infos[1], info]
    assert sup._back_refusal(info, dataclasses.replace(info, addr="198.18.0.9"),
                             [3, 4, 5]).startswith("it now runs 3 workers at 198.18.0.9")
    assert "different config" in sup._back_refusal(
        info, dataclasses.replace(info, config_hash="other"), [3, 4, 5])
    assert sup._back_refusal(info, info, [3, 4, 5]) is None
    sup.plan.world.fixer.started(11)
    assert "no round left" in sup._back_refusal(info, info, [3, 4, 5])


@pytest.mark.parametrize("held, algo, expected", [
    ({3: (1, 3), 4: (3,), 5: (3,)}, "gasloc", True),    # each holds the last round it wrote
    ({3: (1,), 4: (3,), 5: (3,)}, "gasloc", False),     # 3's file of round 3 is not there
    ({3: (3,), 4: (3,), 5: (3,)}, "diloco", False),     # a shared momentum: from a donor
])
def test_returning_workers_restore_their_checkpoints_only_where_every_file_is_there(
        held, algo, expected):
    """Checkpoints every 2 rounds (1, 3, 5, ...): the lost workers died in rounds 4 and 5, so
    the last checkpoint each wrote is round 3, not 5 (it was a member but dead then)."""
    from gasloc_emu.cluster.rendezvous import Holdings
    sup, lost = shell(algo, sets=("run.checkpoint_every=2",))
    sup._lose_node(lost)
    sup.scenario.clock = lambda: 6.0
    for t in range(6, 8):
        sup.plan.world.fixer.started(t)
    assert [sup.plan.world.restore_rounds(r, 8) for r in (3, 4, 5)] == [[1, 3]] * 3
    assert sup._from_checkpoints([3, 4, 5], Holdings(1, 2, held)) is expected


def test_losses_and_returns_are_played_in_the_order_node_0_decided_them():
    """By time, a loss before a return at the same time: a second loss of the same host after
    its return comes after that return, whichever list it is in."""
    again = HostLoss(2, "h2", (3, 4), 12, 11.0, {3: 10, 4: 10})
    same_time = HostBack(2, "h2", (3, 4), 13, 11.0)
    assert in_decided_order([again, LOSS], [same_time, BACK]) == [LOSS, BACK, again, same_time]


# ---------------------------------------------------------------- the scenario of a lost host

def timed_world(*events, workers=6, rounds=20, peers=ring_peers, join_messages=1) -> World:
    return World(Scenario(tuple(events), workers, rounds, "timed"), workers, rounds, 2.0,
                 peers, armed=True, join_messages=join_messages)


def fix_at(w: World, now_s: float, started: int) -> None:
    w.fixer.started(started)
    w.fix(w.fixer.due(now_s))


def lose(w: World, at_s: float, ranks, last_rows, node=2) -> HostLoss:
    loss = HostLoss(node, f"h{node}", tuple(ranks), w.fixer.fixed_unplanned(at_s, ranks), at_s,
                    dict(last_rows))
    w.lose(loss)
    return loss


def back(w: World, at_s: float, ranks, node=2) -> HostBack:
    ret = HostBack(node, f"h{node}", tuple(ranks), w.fixer.fixed_unplanned(at_s, ranks), at_s)
    w.back(ret)
    return ret


def test_a_crashed_worker_lost_with_its_host_is_not_restarted_until_the_host_comes_back():
    """Worker 3 crashes at 1 s (a leave) and would restart at 3 s (a join); its host is lost at
    2 s meanwhile. The loss makes no leave of 3 (gone already), the restart is not played (its
    process is dead with the host: recorded why), a later crash of 4 neither; the host's
    return brings both back, and 3's crash and restart after it are played."""
    from gasloc_emu.scenario.events import JoinEvent, LeaveEvent
    w = timed_world(LeaveEvent(worker=3, at_s=1.0), JoinEvent(worker=3, at_s=3.0),
                    LeaveEvent(worker=4, at_s=4.0), JoinEvent(worker=3, at_s=9.0),
                    LeaveEvent(worker=3, at_s=8.0))
    fix_at(w, 1.0, 1)                                   # 3 leaves at round 2
    loss = lose(w, 2.0, (3, 4, 5), {3: 1, 4: 2, 5: 2})  # round 3
    fix_at(w, 4.0, 4)                                   # 3's join and 4's leave: round 5
    assert loss.round == 3 and w.alive(2) == frozenset({0, 1, 2, 4, 5})
    assert all(w.alive(t) == frozenset({0, 1, 2}) for t in range(3, 20))
    assert w.lost_now() == frozenset({3, 4, 5})
    assert [(s["type"], s["worker"], s["round"], s["at_s"], s["why"]) for s in w.skipped] == [
        ("join", 3, 5, 3.0, "lost with its host"), ("leave", 4, 5, 4.0, "lost with its host")]
    assert [(c["type"], c["worker"], c["round"]) for c in w.left_and_joined()] == [
        ("leave", 3, 2), ("leave", 4, 3), ("leave", 5, 3)]
    from gasloc_emu.scenario.observed import event_text, round_records
    assert [event_text(r) for r in round_records(w, 5)] == [
        "round 5: not played: worker 3 joins (lost with its host)",
        "round 5: not played: worker 4 leaves (lost with its host)"]
    ret = back(w, 6.0, (3, 4, 5))                       # round 6
    fix_at(w, 9.0, 6)                                   # 3 crashes at 8 s (round 7), back at 9
    assert ret.round == 6 and w.alive(6) == frozenset(range(6))
    assert w.alive(7) == frozenset({0, 1, 2, 4, 5}) and w.alive(8) == frozenset(range(6))
    assert w.lost_now() == frozenset()


def test_a_restart_after_the_return_of_a_worker_whose_crash_was_not_played_is_not_played():
    from gasloc_emu.scenario.events import JoinEvent, LeaveEvent
    w = timed_world(LeaveEvent(worker=4, at_s=3.0), JoinEvent(worker=4, at_s=7.0))
    w.fixer.started(0)
    lose(w, 2.0, (3, 4, 5), {3: 0, 4: 0, 5: 0})         # round 1
    fix_at(w, 3.0, 1)                                   # 4's crash: lost, round 2
    back(w, 5.0, (3, 4, 5))                             # round 3
    fix_at(w, 7.0, 3)                                   # 4's restart: alive already, round 4
    assert [(s["type"], s["worker"], s["why"]) for s in w.skipped] == [
        ("leave", 4, "lost with its host"), ("join", 4, "alive already")]
    assert all(w.alive(t) == frozenset(range(6)) for t in range(3, 20))


def test_a_crash_that_would_leave_no_worker_after_a_lost_host_is_not_played():
    """On four workers: 2 and 3 are lost, then 0 crashes: 1 stays. 1's crash after it would
    leave nobody, so it is not played; 0 restarts from 1."""
    from gasloc_emu.scenario.events import JoinEvent, LeaveEvent
    w = timed_world(LeaveEvent(worker=0, at_s=3.0), LeaveEvent(worker=1, at_s=4.0),
                    JoinEvent(worker=0, at_s=5.0), workers=4)
    w.fixer.started(0)
    lose(w, 2.0, (2, 3), {2: 0, 3: 0})
    fix_at(w, 5.0, 1)
    assert [(s["type"], s["worker"], s["why"]) for s in w.skipped] == [
        ("leave", 1, "last worker")]
    assert w.alive(19) == frozenset({0, 1})


def test_a_loss_that_would_leave_no_worker_is_refused_and_the_world_stays_as_it_was():
    from gasloc_emu.scenario.events import LeaveEvent, ScenarioError
    w = timed_world(LeaveEvent(worker=0, at_s=1.0), workers=3)
    fix_at(w, 1.0, 0)      # round 1; a loss of the others there would skip it (last worker)
    w.fixer.started(1)
    with pytest.raises(ScenarioError, match="no worker would be alive"):
        lose(w, 2.0, (1, 2), {1: 0, 2: 0})
    assert w.losses == [] and w.alive(19) == frozenset({1, 2})


def test_a_partition_naming_lost_workers_cuts_the_others_and_one_emptied_is_not_played():
    from gasloc_emu.scenario.events import PartitionEvent
    w = timed_world(PartitionEvent(at_s=3.0, end_s=4.0, groups=((0, 3), (1, 2))),
                    PartitionEvent(at_s=5.0, groups=((4, 5), (0, 1, 2, 3))))
    w.fixer.started(0)
    lose(w, 2.0, (3, 4, 5), {3: 0, 4: 0, 5: 0})        # round 1
    fix_at(w, 5.0, 1)
    assert w.cut_edges(2) == frozenset({(0, 1), (0, 2)})
    assert [(s["type"], s["why"]) for s in w.skipped] == [
        ("partition", "names workers lost with their host")]
    assert w.cut_edges(19) == frozenset()


def test_what_a_donor_sends_a_joiner_dead_with_its_host_is_lost_with_it():
    """Worker 3 restarts at round 2 on a host already dead (node 0 had not found it yet): its
    donor's parameters and DiLoCo's momentum (two messages) go to a dead process."""
    from gasloc_emu.scenario.events import JoinEvent, LeaveEvent
    w = timed_world(LeaveEvent(worker=3, at_s=1.0), JoinEvent(worker=3, at_s=2.0),
                    join_messages=2)
    fix_at(w, 2.0, 0)                                   # 3 leaves at 1, joins at 2
    assert w.plan(3, 2).join_from == 0
    lose(w, 3.0, (3, 4, 5), {3: 0, 4: 2, 5: 2})        # round 3: 3 dead from round 1
    # ring of 6 in round 2: each sends 2 * 5 messages to the next; 2 -> 3, and 0 donates
    assert w.sent_to_dead() == {2: 10, 0: 2}


def test_a_remote_worker_leaving_as_planned_is_waited_for_while_its_node_beats(tmp_path):
    """Worker 4 (node 2) leaves at round 6 as the scenario says: it flushes its last messages
    (up to LEAVE_FLUSH_S) and dies without a word. Silent, it is not a failure while its node
    beats (its node reports the exit), up to that flush past the heartbeat timeout; a worker
    with no leave due, or a node that stopped beating, is judged at once."""
    scenario = tmp_path / "leave.toml"
    scenario.write_text('[[event]]\ntype = "leave"\nworker = 4\nat_s = 5.0\n')
    sup, _ = shell("gasloc", sets=(f"run.scenario={scenario}", "run.heartbeat_timeout_s=3"))
    sup.plan.world.fix(sup.plan.world.fixer.due(5.25))
    assert sup._planned_leave(sup.slots[4]) == 6
    sup.slots[4].round, sup.slots[3].round = 5, 5
    beats = {"silent_s": 0.2}
    sup.node.rdv = SimpleNamespace(status=lambda node: None,
                                   silent_s=lambda node, now: beats["silent_s"])
    for s in sup.slots:
        s.last_seen = 100.0
    assert sup._exit_reported_soon(sup.slots[4], now=104.0)       # its node will report it
    assert sup._exit_reported_soon(sup.slots[4], now=112.5)       # still flushing, maybe
    assert not sup._exit_reported_soon(sup.slots[4], now=113.5)   # 3 s + LEAVE_FLUSH_S
    assert not sup._exit_reported_soon(sup.slots[3], now=104.0)   # no leave due: silent
    beats["silent_s"] = 2.0
    assert not sup._exit_reported_soon(sup.slots[4], now=104.0)   # its node is silent too
