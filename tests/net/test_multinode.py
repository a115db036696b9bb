"""One run across emulated hosts: network namespaces on a bridge, one node agent in each.

Each test runs ``hosts.py``, which builds the hosts (198.18.0.1, 198.18.0.2, like machines on a
LAN) inside its own user namespace and starts one ``gasloc-emu run`` per host, launched the way
a user would: torchrun's flag names by hand, torchrun itself, or Slurm's environment.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from needs import unavailable

from gasloc_emu import config
from gasloc_emu.plan import build_plan
from gasloc_emu.scenario.fixing import Fixing
from gasloc_emu.scenario.hostloss import HostBack, HostLoss, in_decided_order
from gasloc_emu.simulator.simulate import simulate

MASTER = "198.18.0.1"
SECRET = {"GASLOC_SECRET": "multi-node test secret, not a real one"}
BASE = ["--workers", "4", "--no-dashboard", "--seed", "3"]
# The launch forms beyond the by-hand one, the config refusal and node 0's death take ~2 min
# together; CI's 15-minute budget keeps them out unless asked for (GASLOC_SLOW_TESTS=1).
slow = pytest.mark.slow
# the shaped run's wall-clock over its busiest link's wire time, at most: startup and compute
WALL_OVER_FLOOR = 3.0


def _cli() -> list[str]:
    return [sys.executable, "-m", "gasloc_emu"]


def _by_hand(rank: int, out: Path, *extra: str, nnodes: int = 2) -> dict:
    argv = [*_cli(), "run", *BASE, "--nnodes", str(nnodes), "--node-rank", str(rank),
            "--master-addr", MASTER, "--master-port", "29400", "--out", str(out), *extra]
    return {"host": rank, "argv": argv, "env": SECRET}


def _ok(result: dict) -> None:
    for i, node in enumerate(result["nodes"]):
        assert node["rc"] == 0, f"node {i} exited {node['rc']}: {node['err'][-1500:]}"
    assert result["left"] == {}, f"processes left in the hosts: {result['left']}"


def _simulated_loss(tmp_path: Path, rounds: int, *sets: str) -> float:
    cfg = config.resolve(overrides={"workers": 4, "seed": 3, "run.rounds": rounds}, sets=sets)
    return simulate(build_plan(cfg), tmp_path / "sim")["final_eval_loss"]


def _losses(record: Path) -> dict:
    """(worker, round) -> training loss, from a record's metrics."""
    rows = [json.loads(line) for line in (record / "metrics.jsonl").read_text().splitlines()]
    return {(r["worker"], r["round"]): r["train_loss"] for r in rows}


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_two_hosts_by_hand_equal_simulate(hosts, tmp_path):
    """Split unevenly (1 + 3, as hosts with different GPU counts would be)."""
    out = tmp_path / "rec"
    result = hosts([_by_hand(k, out, "--rounds", "3", "--nproc-per-node", str(1 + 2 * k))
                    for k in range(2)])
    _ok(result)
    summary = _summary(out)
    # not the same bits as simulate: node 0's one worker gets more CPU threads than node 1's
    # three (and than simulate's), and CPU kernels sum in an order that depends on that count.
    # Round 2's losses differ by up to 5e-7 (1.4e-7 relative); 1e-6 relative is the bound.
    assert summary["final_eval_loss"] == pytest.approx(_simulated_loss(tmp_path, 3), rel=1e-6)
    ran, simulated = _losses(out), _losses(tmp_path / "sim")
    assert len(ran) == 4 * 3 and ran.keys() == simulated.keys()
    assert all(ran[k] == pytest.approx(simulated[k], rel=1e-6) for k in ran), (ran, simulated)
    workers = json.loads((out / "workers.json").read_text())
    assert [(w["rank"], w["node"]) for w in workers] == [(0, 0), (1, 1), (2, 1), (3, 1)]
    assert [n["addr"] for n in summary["nodes"]] == result["addrs"]
    assert summary["launch"] == "flags" and summary["nodes"][1]["workers"] == [1, 2, 3]
    assert summary["security"] == "curve"
    assert not (tmp_path / "rec.node1" / "summary.json").exists()  # one record: node 0's
    assert (tmp_path / "rec.node1" / "workers" / "worker3.log").exists()


def test_a2cid2_pairs_workers_across_hosts(hosts, tmp_path):
    """Asynchronous pairwise gossip over two hosts (1 + 3 workers on a ring), its exchanges
    compressed (int8): node 0's pairer pairs workers of both hosts over the control plane, and
    the frames cross the hosts' link and pass each receiver's schema."""
    out = tmp_path / "rec"
    result = hosts([_by_hand(k, out, "--rounds", "6", "--algo", "a2cid2", "--topology", "ring",
                             "--step-time-s", "0.02", "--codec", "int8",
                             "--nproc-per-node", str(1 + 2 * k)) for k in range(2)])
    _ok(result)
    summary = _summary(out)
    assert summary["status"] == "ok" and summary["algorithm"] == "a2cid2"
    steps = {}
    for (worker, step) in _losses(out):
        steps[worker] = max(steps.get(worker, -1), step)
    assert steps == {0: 5, 1: 5, 2: 5, 3: 5}   # every worker took its 6 steps
    pairs = summary["asynchronous"]["pairings"]
    crossing = {k: n for k, n in pairs.items() if "0" in k.split("-")}   # worker 0 is node 0's
    assert sum(crossing.values()) > 0, pairs
    assert summary["comm"]["ratio"] == pytest.approx(0.25 + 1 / 256, rel=1e-3)
    assert summary["drops"]["total"] == 0


@slow
def test_overlap_with_a_scenario_across_hosts_equals_simulate(hosts, tmp_path):
    """Overlapped DiLoCo (its All-Reduce in the background) over two hosts, with a scenario
    that halves one worker's speed: the losses of the simulator.

    Slow (the CI suite's budget): test_overlap_run's overlapped DiLoCo in worker processes
    holds the overlap to the simulator's bits, test_timed_self_run a speed scenario, and the
    by-hand and shaped cross-host tests here a run over two hosts equal to the simulator."""
    out, scenario = tmp_path / "rec", tmp_path / "slow.toml"
    scenario.write_text("[[event]]\ntype = 'speed'\nworker = 1\nround = 1\nspeed = 0.5\n")
    sets = ("algo.name=diloco", "algo.overlap=1", "compute.step_time_s=0.02",
            f"run.scenario={scenario}")
    result = hosts([_by_hand(k, out, "--rounds", "3", "--nproc-per-node", str(1 + 2 * k),
                             *[arg for s in sets for arg in ("--set", s)]) for k in range(2)])
    _ok(result)
    summary = _summary(out)
    assert summary["status"] == "ok"
    # within the by-hand test's bound: node 0's one worker has more CPU threads than simulate's
    assert summary["final_eval_loss"] == pytest.approx(_simulated_loss(tmp_path, 3, *sets),
                                                       rel=1e-6)


@slow
def test_a_partition_at_a_time_across_hosts_is_replayed_exactly(hosts, tmp_path, preempted_ms):
    """Node 0's launcher fixes a partition at a time for the workers of both hosts (they ask
    it at each round start); it fires within 10 ms (plus the wait for a core this host has
    now: the launcher's timer is a process that shares the cores), the record keeps its
    rounds, and `simulate --replay` of that record gives the run's losses.

    Slow (the CI suite's budget): the random-fault test below has node 0 fix events at a time
    for the workers of three hosts, which ask it at each round start, and replays the record
    row by row; test_timed_membership fixes partitions at a time and bounds their lateness."""
    out, scenario = tmp_path / "rec", tmp_path / "cut.toml"
    scenario.write_text("[[event]]\ntype = 'partition'\ngroups = [[0, 1], [2, 3]]\n"
                        "at_s = 0.3\nend_s = 0.7\n")
    result = hosts([_by_hand(k, out, "--rounds", "8", "--nproc-per-node", str(1 + 2 * k),
                             "--step-time-s", "0.05", "--local-steps", "2", "--topology", "ring",
                             "--scenario", str(scenario)) for k in range(2)])
    _ok(result)
    summary = _summary(out)
    assert summary["status"] == "ok"
    assert [f["part"] for f in summary["membership"]["fixings"]] == ["start", "end"]
    assert summary["timed_events"]["fired"] == 2
    assert summary["timed_events"]["max_late_ms"] < 10 + preempted_ms, preempted_ms
    replay = subprocess.run([*_cli(), "simulate", "--replay", str(out), "--out",
                             str(tmp_path / "replay")], capture_output=True, text=True)
    assert replay.returncode == 0, replay.stderr
    again = _summary(tmp_path / "replay")
    assert again["final_eval_loss"] == pytest.approx(summary["final_eval_loss"], abs=1e-5)
    # to the bit: the replay computes each worker with the CPU threads it had (node 0's one
    # worker more than node 1's three), as workers.json has them
    assert _losses(tmp_path / "replay") == _losses(out)


def _assert_threads_of_hosts_1_2_3(out: Path) -> None:
    """Each host's CPU threads per worker (the cores over its own workers), which the record
    keeps and `simulate --replay` computes each worker with: hosts of 1, 2 and 3 workers."""
    threads = [r["threads"] for r in json.loads((out / "workers.json").read_text())]
    cores = os.cpu_count() or 1
    assert threads == [cores] + [max(1, cores // 2)] * 2 + [max(1, cores // 3)] * 3


def _replayed(out: Path, to: Path) -> subprocess.CompletedProcess:
    replay = subprocess.run([*_cli(), "simulate", "--replay", str(out), "--out", str(to)],
                            capture_output=True, text=True)
    assert replay.returncode == 0, replay.stderr
    return replay


@slow
def test_a_timed_leave_and_join_across_three_hosts_is_replayed(hosts, tmp_path):
    """Three hosts with 1, 2 and 3 workers on random matchings; worker 4 (on the third host)
    leaves at a time and joins again at a time: its node kills nothing itself, node 0 orders
    its successor there. The run ends ok and `simulate --replay` gives its losses to the bit,
    with each host's CPU threads per worker (the cores over its own workers: the lone worker
    of the first host has more, and sums in another order, than those sharing a host), which
    the record keeps and the replay computes each worker with.

    Slow: the random-fault test below runs the same three hosts with a crash and restart on
    another node than 0 (a timed leave and join there), checks the same threads per worker
    and the replay row by row, and loses a host besides."""
    out, scenario = tmp_path / "rec", tmp_path / "churn.toml"
    scenario.write_text("[[event]]\ntype = 'leave'\nworker = 4\nat_s = 0.3\n\n"
                        "[[event]]\ntype = 'join'\nworker = 4\nat_s = 0.7\n")
    result = hosts([_by_hand(k, out, "--workers", "6", "--rounds", "10", "--nproc-per-node",
                             str(k + 1), "--step-time-s", "0.05", "--local-steps", "2",
                             "--topology", "matching", "--scenario", str(scenario), nnodes=3)
                    for k in range(3)])
    _ok(result)
    summary = _summary(out)
    assert summary["status"] == "ok", summary.get("error")
    fixings = summary["membership"]["fixings"]
    assert [f["index"] for f in fixings] == [0, 1] and fixings[0]["round"] < fixings[1]["round"]
    worker4 = sorted(r for (w, r) in _losses(out) if w == 4)
    assert len(worker4) < 10 and worker4[-1] == 9   # away for some rounds, back to the end
    assert (tmp_path / "rec.node2" / "workers" / "worker4.log").exists()
    _assert_threads_of_hosts_1_2_3(out)
    _replayed(out, tmp_path / "replay")
    again = _summary(tmp_path / "replay")
    assert again["final_eval_loss"] == pytest.approx(summary["final_eval_loss"], abs=1e-5)
    assert _losses(tmp_path / "replay") == _losses(out)   # row by row, to the bit


# seed 20 draws (faults.json): node 1's host lost as the scenario says at 0.5 s and back at
# 1.47 s, worker 3's crash at 1.83 s and its restart at 4.04 s, worker 4's at 5.12 s and
# 6.64 s, node 1's host again at 5.23 s, and hangs
RANDOM_FAULTS = """
[faults]
seed = 20
horizon_s = 6.0

[[faults.crash]]
mtbf_s = 6.0
workers = [3, 4]
duration_median_s = 1.5

[[faults.hang]]
mtbf_s = 4.0
duration_median_s = 0.1

[[faults.host]]
mtbf_s = 6.0
hosts = [[1, 2]]
duration_median_s = 1.0
"""
ROUNDS_FAULTS = 20


# every path of the host's loss, each run every time: the algorithm (GASLoC on random
# matchings, or DiLoCo, whose rounds broken by the loss are not committed), whether the host
# comes back, and, for a return, whether its workers come from their own checkpoints; the three
# cases cover each value of each (a return without checkpoints is taken from a neighbour, one
# without a return does not read checkpoints), not their every product (about 36 s each)
FAULT_CASES = [("gasloc", 1, True), ("diloco", 0, True), ("gasloc", 0, False)]


@pytest.mark.parametrize("algo,every,comes_back", FAULT_CASES,
                         ids=["gasloc-checkpoints-back", "diloco-back", "gasloc-not-back"])
def test_random_faults_and_a_host_killed_without_warning_are_survived_and_replayed(
        hosts, tmp_path, algo, every, comes_back):
    """Three hosts with 1, 2 and 3 workers, shaped by tc, a random-fault section (crashes and
    restarts, hangs, node 1's host lost and back as the scenario says), and node 2's agent
    (and its workers with it) killed with SIGKILL once worker 3 has crashed; the run does not
    know it in advance (``run.on_worker_loss = continue``). Node 0 finds the node silent,
    decides the round its workers leave at, and tells the others; a restart of theirs fixed
    before that is played as a process dead with the host (what its donor sent is lost with
    it), one fixed after is not played (the record says why). The run ends ok, every message
    lost with the dead host is counted exactly (``dead_peer``), `simulate --replay` gives the
    run's losses row by row, its drops and its membership, and nothing is left running on
    any host. The cases (``FAULT_CASES``):
    - the algorithm: GASLoC on random matchings, or DiLoCo, whose rounds broken by the loss
      are not committed, the same in the replay;
    - whether the host comes back: its agent started again by hand with the same command,
      which first removes the tc root its predecessor left; node 0 takes every worker lost
      with it back at a round no worker has started, from their own checkpoints where the run
      writes them and GASLoC's state is each worker's own, else from a living neighbour; the
      lost workers have no rows between their death and their return. Else the run ends
      without them."""
    why = f"{algo}, checkpoints {every}" + (", started again" if comes_back else "")
    out, scenario = tmp_path / "rec", tmp_path / "faults.toml"
    scenario.write_text(RANDOM_FAULTS)
    profile = tmp_path / "fast.toml"   # shaped by tc on every host: what the killed agent left
    profile.write_text("[default]\nrate_mbit = 1000\n")
    nodes = _going_on_after_losses(out, rounds=ROUNDS_FAULTS, heartbeat_timeout_s=3, algo=algo)
    for n in nodes:
        n["argv"] += ["--scenario", str(scenario), "--step-time-s", "0.1",
                      "--set", f"run.checkpoint_every={every}",
                      "--bw-profile", str(profile), "--shaper", "tc"]
    result = hosts(nodes, kill={"node": 2, "after_s": 0.0,
                                "output": {"node": 0, "text": "worker 3 leaves"}}
                   | ({"restart_after_s": 0.5} if comes_back else {}))
    for k in (0, 1, 2) if comes_back else (0, 1):
        assert result["nodes"][k]["rc"] == 0, (why, k, result["nodes"][k]["err"][-1500:])
    assert result["left"] == {}, (why, result["left"])
    summary = _summary(out)
    assert summary["status"] == "ok", (why, summary.get("error"))
    assert summary["shaper"] == "tc", why
    membership = summary["membership"]
    assert json.loads((out / "faults.json").read_text())["counts"]["host"] == {"played": 2}
    [loss] = membership["host_losses"]
    assert loss["node"] == 2 and loss["ranks"] == [3, 4, 5], (why, loss)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    left = [e["worker"] for e in events if e.get("reason") == "host lost"]
    assert left and set(left) <= {3, 4, 5}, (why, events)   # those alive at the loss's round
    ran, world = _losses(out), _record_world(out)
    if comes_back:
        _came_back(result, membership, loss, ran, out, world, every, algo, why)
    else:
        assert "host_backs" not in membership, why
        assert membership["alive_at_end"] == [0, 1, 2], why
        for r in (3, 4, 5):   # no row of a lost worker past the round it died in
            assert max(t for (w, t) in ran if w == r) == loss["last_rows"][str(r)], why
    for s in membership.get("skipped", ()):   # only what the dead host's workers could not do
        assert s["worker"] in (3, 4, 5) and loss["round"] <= s["round"], (why, s)
    # over every process of each worker there at the end: one that left as the scenario says
    # and came back did without messages of the dead in its earlier life too
    lost_by = _lost_with_the_host(out, world)
    expected = {str(w): {"dead_peer": lost_by[w]} if lost_by.get(w) else {}
                for w in membership["alive_at_end"]}
    assert summary["drops"]["by_worker"] == expected, (why, summary["drops"], expected)
    _assert_threads_of_hosts_1_2_3(out)
    _replayed(out, tmp_path / "replay")
    again = _summary(tmp_path / "replay")
    assert again["membership"]["changes"] == membership["changes"], why
    assert _losses(tmp_path / "replay") == ran, why   # row by row, to the bit
    assert again["drops"] == summary["drops"], why   # the same messages lost with the host
    assert again.get("uncommitted") == summary.get("uncommitted"), why
    skipped = [(s["type"], s["worker"], s["round"], s["why"])
               for s in membership.get("skipped", ())]
    print(f"{why}: lost at round {loss['round']}" + (
        f", back at {membership['host_backs'][0]['round']}"
        f"{' from checkpoints' if membership['host_backs'][0]['from_checkpoint'] else ''}"
        if comes_back else "") + f"; skipped: {skipped}")


def _came_back(result, membership, loss, ran, out, world, every, algo, why) -> None:
    """The killed host's agent, started again, removed the tc root its predecessor left and
    was taken back: every worker lost with it joined at the decided round, from its own
    checkpoint exactly when each took part in a checkpoint round before it died and GASLoC's
    state is each worker's own, and has no row between its death and its return."""
    back_log = result["nodes"][2]["back_out"] + result["nodes"][2]["back_err"]
    assert "back in the run" in back_log, (why, back_log[-2000:])
    assert "tc qdisc del dev eth0 root  # left by run" in back_log, (why, back_log[-2000:])
    [back] = membership["host_backs"]
    assert back["node"] == 2 and back["ranks"] == [3, 4, 5], (why, back)
    assert loss["round"] < back["round"] < ROUNDS_FAULTS, (why, loss, back)
    assert membership["alive_at_end"] == [0, 1, 2, 3, 4, 5], why
    joins = [c for c in membership["changes"] if c.get("reason") == "host back"]
    assert [(c["worker"], c["round"]) for c in joins] == \
        [(r, back["round"]) for r in (3, 4, 5)], (why, joins)
    wrote = {r: world.restore_rounds(r, back["round"]) for r in (3, 4, 5)}
    restores = bool(every) and algo == "gasloc" and all(wrote.values())
    assert back["from_checkpoint"] == restores, (why, back, wrote)
    for r in (3, 4, 5):   # no row from the round it died in to its return
        last = loss["last_rows"][str(r)]
        assert not [t for (w, t) in ran if w == r and last < t < back["round"]], (why, r)
        log = (out.parent / "rec.node2" / "workers" / f"worker{r}.log").read_text()
        restored = f"rejoins at round {back['round']} from its checkpoint of round " \
                   f"{wrote[r][-1] if wrote[r] else None}"
        assert (restored in log) == restores, (why, r, log[-2000:])


def test_torchrun_launch(hosts, tmp_path):
    """Two hosts launched by torchrun itself (its rendezvous names the nodes)."""
    if shutil.which("torchrun") is None:
        unavailable("needs torchrun (torch's launcher)")
    out = tmp_path / "rec"
    # is_host and --local-addr: torchrun finds its host and the address it tells the others
    # from the machine's host name, which names the real machine here, not the emulated hosts
    nodes = [{"host": k, "env": SECRET, "argv": [
        "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{MASTER}:29410", "--rdzv-id", "gasloc-test",
        "--rdzv-conf", f"is_host={int(k == 0)}", "--local-addr", f"198.18.0.{k + 1}",
        "-m", "gasloc_emu",
        "run", *BASE, "--rounds", "2", "--out", str(out)]} for k in range(2)]
    _ok(hosts(nodes))
    summary = _summary(out)
    assert summary["launch"] == "torchrun" and len(summary["nodes"]) == 2
    # one worker per node: thread counts differ from simulate's, as in the by-hand test
    assert summary["final_eval_loss"] == pytest.approx(_simulated_loss(tmp_path, 2), rel=1e-6)


def test_slurm_launch(hosts, tmp_path):
    """Two hosts launched as Slurm starts them: its environment names the nodes."""
    out = tmp_path / "rec"
    nodes = [{"host": k, "argv": [*_cli(), "run", *BASE, "--rounds", "2", "--out", str(out)],
              "env": SECRET | {"SLURM_NODEID": str(k), "SLURM_NNODES": "2", "SLURM_JOB_ID": "7",
                               "SLURM_JOB_NODELIST": "198.18.0.[1-2]"}} for k in range(2)]
    _ok(hosts(nodes))
    summary = _summary(out)
    assert summary["launch"] == "slurm" and [n["node"] for n in summary["nodes"]] == [0, 1]


def test_a_host_with_another_config_is_refused_on_every_host(hosts, tmp_path):
    out = tmp_path / "rec"
    result = hosts([_by_hand(0, out, "--rounds", "3"), _by_hand(1, out, "--rounds", "4")],
                   timeout_s=90)
    for node in result["nodes"]:
        assert node["rc"] == 2, node["err"]
        assert "different config: run.rounds = 3 on node 0, 4 on node 1" in node["err"]
    assert _summary(out)["status"] == "failed"
    assert result["left"] == {}


def _training(out) -> dict:
    """The kill waits for training on both hosts (a row from each host's workers, 0-1 and 2-3),
    not a fixed time: on a busy machine a host may not have joined 10 s after its start."""
    return {"metrics": str(out / "metrics.jsonl"), "workers": [0, 1, 2, 3]}


def test_a_killed_host_ends_the_run_on_the_other_within_the_timeout(hosts, tmp_path):
    out = tmp_path / "rec"
    timeout = ["--set", "run.heartbeat_timeout_s=3"]
    result = hosts([_by_hand(k, out, "--rounds", "400", *timeout) for k in range(2)],
                   kill={"node": 1, "after_s": 0.3, "training": _training(out)})
    master = result["nodes"][0]
    assert master["rc"] == 1, master["err"]
    assert master["after_kill_s"] < 3 + 8, master  # the timeout, then the stop and the record
    summary = _summary(out)
    assert summary["status"] == "failed"
    assert "node 1" in summary["error"] and "[2, 3]" in summary["error"], summary["error"]
    assert result["left"] == {}, result["left"]


@slow
def test_a_killed_node_0_ends_the_run_on_the_others(hosts, tmp_path):
    """Node 0 (the rendezvous store and the record) killed mid-run: the other host's run ends
    within the heartbeat timeout, naming it, and leaves nothing. Slow (the CI suite's
    budget): test_node_0_killed_while_a_lost_host_is_survived_leaves_nothing_on_any_host
    checks the same ending, with a fault under way."""
    out = tmp_path / "rec"
    timeout = ["--set", "run.heartbeat_timeout_s=4"]
    result = hosts([_by_hand(k, out, "--rounds", "400", *timeout) for k in range(2)],
                   kill={"node": 0, "after_s": 1.0, "training": _training(out)})
    other = result["nodes"][1]
    assert other["rc"] == 1, other["err"]
    assert other["after_kill_s"] < 4 + 8, other
    assert "error: node 1: lost node 0" in other["err"], other["err"]
    assert result["left"] == {}, result["left"]


@pytest.mark.parametrize("shaper", ["tc", pytest.param("userspace", marks=slow)])
def test_shaped_cross_host_run(hosts, tmp_path, shaper):
    """8 Mbit/s links, 2 hosts: the run takes what its busiest link needs, within a factor of
    the startup and compute around it, and its losses are simulate's. The userspace arm is
    slow; covered in the default suite by the tc arm (the same run) and
    tests/integration/test_zmq_transport.py's userspace shaper on the receiver's clock."""
    out, profile = tmp_path / "rec", tmp_path / "8mbit.toml"
    profile.write_text("[default]\nrate_mbit = 8\n")
    net = ["--bw-profile", str(profile), "--shaper", shaper]
    result = hosts([_by_hand(k, out, "--rounds", "2", *net) for k in range(2)])
    _ok(result)
    summary = _summary(out)
    assert summary["shaper"] == shaper and summary["nodes"][1]["shaper"] == shaper
    links = json.loads((out / "links.json").read_text())["links"]
    busiest_s = max(r["bytes"] * 8 / (r["configured_mbit"] * 1e6) for r in links)
    # the floor is the busiest link's wire time; above it, the two rounds' compute and the
    # workers' start (at most 3x the floor here: a tiny model's rounds are mostly transfer)
    assert busiest_s * 0.98 <= summary["wall_s"] <= busiest_s * WALL_OVER_FLOOR, \
        (summary["wall_s"], busiest_s)
    sim = _simulated_loss(tmp_path, 2, f"net.bw_profile={profile}")
    assert summary["final_eval_loss"] == sim


LINKCHECK = Path(__file__).with_name("linkcheck.py")


# the userspace shaper's rates are checked on one host too (test_userspace_shaper,
# test_link_observed_in_run); across hosts it is the same code on other addresses
@pytest.mark.parametrize("shaper", ["tc", pytest.param("userspace", marks=pytest.mark.slow)])
def test_a_shaped_cross_host_link_measures_its_rate(hosts, shaper):
    """Host A sends to host B over one 8 Mbit/s link, shaped by the product's tc (one HTB class
    matched on B's address and the link's port) or its userspace shaper; B measures. The
    userspace arm is slow; covered in the default suite by the tc arm and
    tests/integration/test_zmq_transport.py's
    test_the_userspace_shaper_delivers_its_rate_and_latency_on_the_receivers_clock."""
    args = {"a": MASTER, "b": "198.18.0.2", "port": 31000, "rate_mbit": 8.0, "seconds": 5.0,
            "numel": 250_000, "messages": 6}
    recv, send = ("tc-sink", "tc-send") if shaper == "tc" else ("zmq-recv", "zmq-send")
    argv = [sys.executable, str(LINKCHECK)]
    result = hosts([{"host": 1, "argv": [*argv, recv, json.dumps(args)]},
                    {"host": 0, "argv": [*argv, send, json.dumps(args)]}], timeout_s=60)
    _ok(result)
    mbit = float(result["nodes"][0]["out"].split("MBIT ")[1])
    assert mbit == pytest.approx(8.0, rel=0.05), mbit


def test_netem_clean_removes_the_tc_a_killed_node_left(hosts):
    args = json.dumps({"b": "198.18.0.2", "port": 31000, "rate_mbit": 8.0})
    # what `gasloc-emu netem clean` calls for tc roots; the command itself would also remove
    # the namespaces these emulated hosts live in, which are named like a root-mode run's
    clean = "from netem.hosttc import clean_host_leftovers as c; print(len(c()), 'removed')"
    script = (f"{sys.executable} {LINKCHECK} leave-tc '{args}'; tc qdisc show dev eth0; "
              f"{sys.executable} -c \"{clean}\"; tc qdisc show dev eth0")
    result = hosts([{"host": 0, "argv": ["sh", "-c", script]}], timeout_s=60)
    out = result["nodes"][0]["out"]
    left, cleaned = out.split("1 removed")
    assert "qdisc htb" in left and "tc qdisc del dev eth0 root  # left by run 0dead" in left, out
    assert "qdisc htb" not in cleaned and "noqueue" in cleaned, out



def test_a_cloud_placement_across_hosts(hosts, tmp_path):
    """The measured cloud profile on two hosts (workers in Oregon, Ireland, Frankfurt and
    Mumbai; single-stream rates): each link is set to the table's rate, and the losses are
    simulate's."""
    out = tmp_path / "rec"
    net = ["--bw-profile", "cloud", "--placement",
           "aws:us-west-2,aws:eu-west-1,aws:eu-central-1,aws:ap-south-1",
           "--cloud-rate", "single-stream", "--shaper", "tc"]
    result = hosts([_by_hand(k, out, "--rounds", "2", *net) for k in range(2)])
    _ok(result)
    summary = _summary(out)
    assert summary["bw_profile"] == "cloud"
    sets = ("net.bw_profile=cloud",
            "net.placement=aws:us-west-2,aws:eu-west-1,aws:eu-central-1,aws:ap-south-1",
            "net.cloud_rate=single-stream")
    plan = build_plan(config.resolve(overrides={"workers": 4, "seed": 3}, sets=sets),
                      data=False)
    links = json.loads((out / "links.json").read_text())["links"]
    assert links and all(r["configured_mbit"] == pytest.approx(
        plan.link_plan.effective_rate_mbit(r["src"], r["dst"])) for r in links)
    # the slowest leg's latency is paid at least once per round (Oregon to Mumbai: > 100 ms)
    latency_s = max(plan.link_plan.links[(r["src"], r["dst"])].latency_ms for r in links) / 1e3
    assert summary["wall_s"] >= 2 * latency_s, (summary["wall_s"], latency_s)
    assert summary["final_eval_loss"] == _simulated_loss(tmp_path, 2, *sets)


def _going_on_after_losses(out: Path, rounds: int, heartbeat_timeout_s: int,
                           algo: str = "gasloc") -> list[dict]:
    """Three hosts of 1, 2 and 3 workers that go on after a lost host (``run.on_worker_loss
    = continue``): GASLoC on random matchings, or DiLoCo on its ring."""
    exchange = ["--topology", "matching"] if algo == "gasloc" else ["--algo", algo]
    return [_by_hand(k, out, "--workers", "6", "--rounds", str(rounds), "--nproc-per-node",
                     str(k + 1), "--step-time-s", "0.05", "--local-steps", "2", *exchange,
                     "--set", "run.on_worker_loss=continue",
                     "--set", f"run.heartbeat_timeout_s={heartbeat_timeout_s}", nnodes=3)
            for k in range(3)]


def _record_world(out: Path):
    """The world of a record's config with its events at a time, and its hosts lost and back
    played in the order node 0 decided them (what the replay plays)."""
    plan = build_plan(config.resolve(out / "config.toml"), data=False)
    membership = _summary(out)["membership"]
    if "fixings" in membership:
        plan.world.replay([Fixing.from_json(f) for f in membership["fixings"]])
    for x in in_decided_order([HostLoss.from_json(x) for x in membership["host_losses"]],
                              [HostBack.from_json(x) for x in membership.get("host_backs", ())]):
        plan.world.lose(x) if isinstance(x, HostLoss) else plan.world.back(x)
    return plan.world


def _lost_with_the_host(out: Path, world) -> dict[int, int]:
    """{worker: the messages lost with dead hosts that it must count}: those it did without
    (its rows say which) and those it sent to the dead workers in the rounds they were
    members but dead (from the record's ``world``, ``_record_world``)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    counts = {}
    for row in rows:
        counts[row["worker"]] = counts.get(row["worker"], 0) + len(row.get("dead_peer") or ())
    for w, n in world.sent_to_dead().items():
        counts[w] = counts.get(w, 0) + n
    return counts


def test_node_0_killed_while_a_lost_host_is_survived_leaves_nothing_on_any_host(hosts,
                                                                                 tmp_path):
    """A kill -9 of the launcher (node 0) during a fault: node 2's agent is killed, node 0
    decides to go on without it, and is itself killed just after. The remaining node's run
    ends on its own within the heartbeat timeout, naming node 0, and no process is left on
    any host (what test_a_killed_node_0_ends_the_run_on_the_others checks without a fault)."""
    out = tmp_path / "rec"
    result = hosts(_going_on_after_losses(out, rounds=400, heartbeat_timeout_s=3),
                   kill=[{"node": 2, "after_s": 0.0,
                          "training": _training(out) | {"workers": [0, 1, 2, 3, 4, 5]}},
                         {"node": 0, "after_s": 0.2,
                          "output": {"node": 0, "text": "lost: workers [3, 4, 5]"}}])
    assert "lost: workers [3, 4, 5]" in result["nodes"][0]["out"], result["nodes"][0]["out"]
    other = result["nodes"][1]
    assert other["rc"] == 1, other["err"]
    assert other["after_kill_s"] < 3 + 8, other
    assert "error: node 1: lost node 0" in other["err"] or \
        "node 0 (vm) silent" in other["err"], other["err"]
    assert result["left"] == {}, result["left"]
