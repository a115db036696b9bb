"""Checkpoint files and the round a run resumes from (``training.checkpoint``), without a run;
what a checkpointed run refuses; a record resumed at a round."""
from __future__ import annotations

import errno
import json
import os

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from gasloc_emu import config as C
from gasloc_emu.plan import build_plan, refuse_resume
from gasloc_emu.report.records import RunRecord, resume_point, rows_by_round
from gasloc_emu.training import checkpoint as ck


def state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"theta": torch.randn(64, generator=g), "step": 7, "speed": 0.5,
            "optimizer": {"state": {0: {"exp_avg": torch.randn(8, generator=g)}},
                          "param_groups": [{"lr": 1e-3, "params": [0]}]}}


def test_a_file_reads_back_to_the_same_state(tmp_path):
    store = ck.Checkpoints(tmp_path)
    store.save(2, 5, state(1))
    got = store.load(2, 5)
    assert torch.equal(got["theta"], state(1)["theta"])
    assert got["optimizer"]["param_groups"] == [{"lr": 1e-3, "params": [0]}]
    assert (got["step"], got["speed"]) == (7, 0.5)
    assert not list(store.dir.glob("*.tmp"))


@pytest.mark.parametrize("damage, says", [
    (lambda b: b[:-10], "truncated"),
    (lambda b: b[:-3] + bytes([b[-3] ^ 1]) + b[-2:], "checksum does not match"),
    (lambda b: b"x" + b, "not a gasloc-emu checkpoint"),
    (lambda b: b.replace(b'"version": 1', b'"version": 9'), "checkpoint version 9"),
])
def test_a_damaged_file_is_refused_by_name(tmp_path, damage, says):
    store = ck.Checkpoints(tmp_path)
    path = store.save(0, 3, state())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ck.CheckpointError, match=says) as err:
        store.load(0, 3)
    assert str(path) in str(err.value)


def test_a_file_under_another_name_is_refused(tmp_path):
    store = ck.Checkpoints(tmp_path)
    store.save(0, 3, state())
    os.replace(store.path(0, 3), store.path(1, 3))
    with pytest.raises(ck.CheckpointError, match="holds worker 0 round 3"):
        store.load(1, 3)


def test_a_full_disk_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    store = ck.Checkpoints(tmp_path)
    store.save(0, 1, state(1))
    before = store.path(0, 1).read_bytes()
    real_write = os.write

    def half_then_full(fd, data):   # the first chunk lands, then the disk is full
        if real_write(fd, bytes(data[: len(data) // 2])) and len(data) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return len(data)

    monkeypatch.setattr(ck.os, "write", half_then_full)
    with pytest.raises(ck.CheckpointError, match="No space left on device.*previous"):
        store.save(0, 3, state(3))
    monkeypatch.undo()
    assert store.path(0, 1).read_bytes() == before
    assert not store.path(0, 3).exists() and not list(store.dir.glob("*.tmp"))


def rows(*rounds, workers=3) -> dict:
    return {r: {w: 0.5 * (r + 1) + 0.01 * w for w in range(workers)} for r in rounds}


def test_the_resume_round_is_the_latest_every_worker_has_with_rows(tmp_path):
    store = ck.Checkpoints(tmp_path)
    for r in (1, 3):
        for w in range(3):
            store.save(w, r, state(r))
    store.save(0, 5, state(5))   # the others had not reached round 5
    point = store.latest_common(range(3), rows(1, 3, 5))
    assert (point.round, point.time_s, point.skipped) == (3, 2.02, ())
    # round 3's files are there, but one row is not (killed between file and row)
    partial = rows(1, 3)
    del partial[3][2]
    assert store.latest_common(range(3), partial).round == 1


def test_a_bad_file_passes_over_its_round_and_is_named(tmp_path):
    store = ck.Checkpoints(tmp_path)
    for r in (1, 3):
        for w in range(3):
            store.save(w, r, state(r))
    bad = store.path(1, 3)
    bad.write_bytes(bad.read_bytes()[:100])
    point = store.latest_common(range(3), rows(1, 3))
    assert point.round == 1 and len(point.skipped) == 1 and str(bad) in point.skipped[0]
    bad1 = store.path(2, 1)
    bad1.write_bytes(b"")
    with pytest.raises(ck.CheckpointError, match="no round that every worker"):
        store.latest_common(range(3), rows(1, 3))


def test_two_hosts_folders_resume_from_the_latest_round_both_hold_whole(tmp_path):
    """Workers 0-1 on one host's disk, 2-3 on another's: each host checks its own files
    (``holdings``), the round is chosen from both (``common_point``), as the latest
    ``latest_common`` over one folder with all four would take."""
    a, b = ck.Checkpoints(tmp_path / "a"), ck.Checkpoints(tmp_path / "b")
    for r in (2, 3, 4):
        for w in range(4):
            (a if w < 2 else b).save(w, r, state(r))
    b.save(3, 5, state(5))   # host b ran ahead of host a
    bad = b.path(2, 4)
    bad.write_bytes(bad.read_bytes()[:-10])
    held_a, refused_a = a.holdings(range(2))
    held_b, refused_b = b.holdings(range(2, 4))
    assert held_a == {0: (2, 3, 4), 1: (2, 3, 4)} and refused_a == ()
    assert held_b == {2: (2, 3), 3: (2, 3, 4, 5)}
    assert [(x.rank, x.round) for x in refused_b] == [(2, 4)] and str(bad) in refused_b[0].why
    point = ck.common_point(held_a | held_b, range(4), rows(2, 3, 4, 5, workers=4),
                            refused_a + refused_b)
    assert (point.round, point.time_s, point.skipped) == (3, 2.03, (refused_b[0].why,))
    # a refusal of a round before the one chosen is no reason given for it
    assert ck.common_point(held_a | held_b, range(4), rows(2, 3, workers=4),
                           [ck.Refusal(0, 1, "old")]).skipped == ()
    # no row of round 3 for worker 1 (killed between its file and its row): round 2
    partial = rows(2, 3, 4, workers=4)
    del partial[3][1]
    assert ck.common_point(held_a | held_b, range(4), partial).round == 2
    with pytest.raises(ck.CheckpointError, match=r"no round .*refused: .*truncated"):
        ck.common_point(held_a | {2: (), 3: (5,)}, range(4), rows(2, 3, 4, workers=4), refused_b)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), max_size=40),
       st.integers(1, 3))
def test_the_watch_moves_only_when_every_worker_has_a_round(reports, every):
    watch = ck.CheckpointWatch(every, range(4))
    have: dict[int, set] = {}
    for w, r in reports:
        new = watch.row(w, r)
        if ck.due(every, r):
            have.setdefault(r, set()).add(w)
        complete = [x for x, ws in have.items() if len(ws) == 4]
        if new is not None:   # the previous complete round: files below it may go
            assert new in complete and new < watch.common
        assert watch.common == max(complete, default=-1)


def test_prune_keeps_the_common_round_and_later(tmp_path):
    store = ck.Checkpoints(tmp_path)
    for r in (1, 3, 5):
        for w in range(2):
            store.save(w, r, state(r))
    store.prune(3)
    assert store.rounds() == {3: {0, 1}, 5: {0, 1}}


def cfg_of(**over) -> C.Config:
    base = {"workers": 4, "run.rounds": 6, "model.preset": "tiny", "run.checkpoint_every": 2,
            "topology.name": "ring"}
    return C.resolve(overrides=base | over)


@pytest.mark.parametrize("over, says", [
    ({"algo.name": "a2cid2"}, "pairs workers by the links' timing"),
    ({"algo.overlap": 1, "topology.name": "complete"}, "algo.overlap = 1 keeps an exchange"),
    ({"sim.batched": True}, "sim.batched = true"),
    ({"algo.name": "test_checkpoint:Undeclared"}, "does not declare the state"),
])
def test_what_a_resumed_run_could_not_repeat_is_refused(over, says):
    with pytest.raises(C.ConfigError, match=f"run.checkpoint_every = 2 cannot be used: .*{says}"):
        build_plan(cfg_of(**over), data=False)


def test_a_scenario_with_leaves_checkpoints_but_is_not_resumed(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[[event]]\ntype = "leave"\nworker = 1\nround = 2\n')
    plan = build_plan(cfg_of(**{"run.scenario": str(path)}), data=False)
    with pytest.raises(C.ConfigError, match="--resume rec: its scenario has workers leave or "
                                            "join"):
        refuse_resume(plan, "rec")
    refuse_resume(build_plan(cfg_of(), data=False), "rec")   # without churn: taken


def test_a_scenario_with_a_partition_at_a_time_checkpoints_but_is_not_resumed(tmp_path):
    """Its rounds were fixed on the interrupted run's clock: a resumed run could not repeat
    them, so its checkpoints serve rejoins only."""
    path = tmp_path / "s.toml"
    path.write_text('[[event]]\ntype = "partition"\ngroups = [[0, 1], [2, 3]]\nat_s = 1.0\n'
                    'end_s = 2.0\n')
    plan = build_plan(cfg_of(**{"run.scenario": str(path)}), data=False)
    with pytest.raises(C.ConfigError, match="--resume rec: its scenario has partitions at a "
                                            "time"):
        refuse_resume(plan, "rec")


def test_a_rejoin_takes_the_latest_whole_checkpoint_before_its_round(tmp_path):
    store = ck.Checkpoints(tmp_path)
    for r in (1, 3, 5):
        store.save(2, r, state(r))
    path = store.path(2, 3)
    path.write_bytes(path.read_bytes()[:-10])   # cut short: passed over for round 1
    got, st, refused = store.last_whole(2, before=5)
    assert got == 1 and torch.equal(st["theta"], state(1)["theta"])
    assert len(refused) == 1 and "w2-r000003.ckpt" in refused[0]
    assert store.last_whole(2, before=6)[0] == 5
    with pytest.raises(ck.CheckpointError, match="worker 2 has no checkpoint of a round before "
                                                 "1"):
        store.last_whole(2, before=1)


def test_prune_keeps_a_departed_workers_latest_checkpoint(tmp_path):
    store = ck.Checkpoints(tmp_path)
    for r in (1, 3, 5, 7):
        for w in range(3):
            if w != 2 or r < 3:   # worker 2 left after round 1
                store.save(w, r, state(r))
    store.prune(5)
    assert store.rounds() == {1: {2}, 5: {0, 1}, 7: {0, 1}}


def test_the_watch_counts_only_the_workers_alive_in_a_round():
    alive = {1: {0, 1, 2}, 3: {0, 1}, 5: {0, 1}}
    watch = ck.CheckpointWatch(2, range(3), lambda r: alive[r])
    for w in range(3):
        assert watch.row(w, 1) is None
    # round 3 is whole without the departed worker 2: files below round 1 may go, then 3
    assert [watch.row(w, 3) for w in (0, 1)] == [None, 1]
    assert [watch.row(w, 5) for w in (0, 1)] == [None, 3]


def test_gasloc_diloco_and_gossip_take_checkpoints():
    for algo in ("gasloc", "diloco", "dsgd", "local-gossip"):
        build_plan(cfg_of(**{"algo.name": algo}), data=False)


from gasloc_emu.algorithms import OuterAlgorithm  # noqa: E402 - the plugin below


class Undeclared(OuterAlgorithm):
    """A plugin that keeps state of its own and does not say which."""

    name = "undeclared"

    def outer_step(self, round_idx, theta):
        pass


def test_a_resumed_record_keeps_the_rows_up_to_its_round(tmp_path):
    cfg = cfg_of()
    with RunRecord(tmp_path, cfg) as rec:
        for r in range(4):
            for w in range(2):
                rec.metric({"round": r, "worker": w, "time_s": r + 0.1 * w})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"round": 4, "worker"')   # cut short by the kill
    with RunRecord(tmp_path, cfg, resume_from=1) as rec:
        rec.metric({"round": 2, "worker": 0, "time_s": 9.0})
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(x["round"], x["worker"]) for x in lines] == [(0, 0), (0, 1), (1, 0), (1, 1),
                                                          (2, 0)]
    assert rows_by_round(tmp_path)[1] == {0: 1.0, 1: 1.1}


def test_resume_without_checkpoints_says_why(tmp_path):
    with pytest.raises(C.ConfigError, match="took no checkpoints"):
        resume_point(tmp_path, cfg_of(**{"run.checkpoint_every": 0}))
    with pytest.raises(C.ConfigError, match="no round that every worker"):
        resume_point(tmp_path, cfg_of())


def test_a_record_of_several_hosts_is_resumed_on_every_host_not_here(tmp_path):
    """Its other hosts' checkpoints are on their disks: one process cannot go on from it."""
    rows_of = [{"rank": r, "node": r // 2, "host": f"h{r // 2}"} for r in range(4)]
    (tmp_path / "workers.json").write_text(json.dumps(rows_of))
    with pytest.raises(C.ConfigError, match=r"a run on 2 hosts keeps each host's checkpoints "
                                            r"on that host; resume it with `gasloc-emu run"):
        resume_point(tmp_path, cfg_of())
    (tmp_path / "workers.json").write_text(json.dumps([{"rank": 0, "pid": 1}]))
    with pytest.raises(C.ConfigError, match="no round that every worker"):
        resume_point(tmp_path, cfg_of())


def test_a_run_that_goes_on_after_lost_hosts_checkpoints_but_is_not_resumed():
    """Its checkpoints serve a lost host's workers that come back; the rounds its losses fell
    on were fixed on the interrupted run's clock, so it is not resumed."""
    plan = build_plan(cfg_of(**{"run.on_worker_loss": "continue"}), data=False)
    assert plan.cfg.run.checkpoint_every == 2
    with pytest.raises(C.ConfigError, match="--resume rec: it went on after hosts lost"):
        refuse_resume(plan, "rec")
