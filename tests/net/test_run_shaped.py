"""`gasloc-emu run` over the shaped network: it completes, records configured vs measured links,
DiLoCo pays for the slow links every round while GASLoC mostly does not, and a killed launcher
leaves nothing behind."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest

from gasloc_emu.config import resolve
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator.simulate import simulate

TINY = ["--model", "tiny", "--no-dashboard", "--set", "data.max_corpus_mb=1"]


def cli(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=timeout)


def load(run_dir: Path, name: str):
    return json.loads((run_dir / name).read_text())


def round_times(run_dir: Path) -> list[float]:
    """Wall-clock length of each round: when its last worker finished minus the round before."""
    ends: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        ends[row["round"]] = max(ends.get(row["round"], 0.0), row["time_s"])
    ordered = [ends[r] for r in sorted(ends)]
    return [b - a for a, b in pairwise(ordered)]


def waiting_times(run_dir: Path) -> list[float]:
    """Each round's length less the compute of its slowest worker, as the run itself measured
    it (metrics.jsonl's compute_s): on a busy machine compute overruns its nominal time by
    different amounts in two runs, and a round's length carries that; what is left is the time
    the round spent on the network."""
    ends: dict[int, float] = {}
    compute: dict[int, float] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        ends[row["round"]] = max(ends.get(row["round"], 0.0), row["time_s"])
        compute[row["round"]] = max(compute.get(row["round"], 0.0), row["compute_s"])
    rounds = sorted(ends)
    return [ends[b] - ends[a] - compute[b] for a, b in pairwise(rounds)]


def test_expander_under_skewed_completes_and_records_links(tc_caps, tmp_path):
    out = tmp_path / "run"
    res = cli("run", "--topology", "expander", "--bw-profile", "skewed", "--workers", "8",
              "--rounds", "3", "--local-steps", "2", *TINY, "--out", str(out))
    assert res.returncode == 0, res.stderr
    s = load(out, "summary.json")
    assert s["status"] == "ok" and s["shaper"] == "tc" and s["profile"].startswith("skewed")
    links = load(out, "links.json")["links"]
    assert len(links) == 8 * 4  # every directed edge of the 4-regular expander
    for lk in links:
        assert lk["measured_mbit"] == pytest.approx(lk["configured_mbit"], rel=0.10), lk
        assert lk["bytes"] > 0
    assert {lk["configured_mbit"] for lk in links} <= {5.0, 50.0}


def test_a_link_slowed_in_place_under_tc_delivers_its_new_rate(tc_caps, tmp_path):
    """A scenario drops 0 <-> 1 from 50 to 5 Mbit/s at round 3: tc changes the classes in place
    and summary.json's link_changes observes 5 Mbit/s within 5 % (issue: a world that
    changes). GSO is sized for 5 Mbit/s from the start, since TCP keeps its set-up size."""
    scenario = tmp_path / "slow.toml"
    scenario.write_text("[[event]]\ntype = 'link'\nround = 3\nlinks = [[0, 1], [1, 0]]\n"
                        "rate_mbit = 5.0\n")
    out = tmp_path / "run"
    res = cli("run", "--workers", "2", "--rounds", "6", "--local-steps", "2", *TINY,
              "--bw-profile", "uniform", "--rate-mbit", "50", "--shaper", "tc", "--no-probe",
              "--scenario", str(scenario), "--out", str(out))
    assert res.returncode == 0, res.stderr
    s = load(out, "summary.json")
    assert s["shaper"] == "tc"
    changes = s["link_changes"]
    assert [(c["src"], c["dst"], c["round"], c["rate_mbit"]) for c in changes] == \
        [(0, 1, 3, 5.0), (1, 0, 3, 5.0)]
    for c in changes:
        assert c["observed_round"] == 3 and len(c["observed_each_mbit"]) == 3, c
        assert c["observed_mbit"] == pytest.approx(5.0, rel=0.05), c


@pytest.mark.slow  # docs/RESULTS.md measures this (and more) on the simulator and the emulator
def test_diloco_pays_for_slow_links_and_gasloc_much_less(tc_caps, tmp_path):
    """Covered in the default suite by tests/integration/test_simulate.py's
    test_diloco_pays_for_the_slow_links_every_round_and_gasloc_rarely (the same effect on the
    simulator's clock)."""
    # seed 0: the skewed profile slows pairs (1,7), (4,7), (6,7); DiLoCo's ring crosses 6 -> 7
    common = ["--bw-profile", "skewed", "--workers", "8", "--seed", "0", "--rounds", "4",
              "--local-steps", "1", "--no-probe", *TINY]
    runs = {}
    for name, algo in {"diloco": ["--algo", "diloco"],
                       "gasloc": ["--algo", "gasloc", "--topology", "matching"]}.items():
        res = cli("run", *algo, *common, "--out", str(tmp_path / name))
        assert res.returncode == 0, res.stderr
        runs[name] = sorted(round_times(tmp_path / name))[1]  # a typical (low-median) round
    # a 482 KB model: DiLoCo's ring moves 2*7/8 of it over a 5 Mbit/s link every round (>= 1.3 s)
    assert runs["diloco"] > 1.2, runs
    assert runs["gasloc"] < 0.6 * runs["diloco"], runs



def _host_state() -> tuple[str, str, str]:
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    qdisc = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    return ns, links, qdisc


def test_sigkill_of_the_launcher_leaves_nothing(tc_caps, tmp_path, alive):
    before = _host_state()
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "gasloc_emu", "run", "--topology", "ring",
                             "--bw-profile", "uniform", "--workers", "4", "--rounds", "500",
                             "--no-probe", *TINY, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text()):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no round finished"
            time.sleep(0.2)
        pids = [w["pid"] for w in load(out, "workers.json")]
        netns_pids = [p for p in pids if alive(p)]
        assert netns_pids, "workers should be running"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    deadline = time.monotonic() + 10
    while [p for p in pids if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)], "worker processes survived the launcher"
    assert _host_state() == before, "the host's namespaces, links or qdiscs changed"


def test_64_workers_on_a_skewed_expander_finish_and_leave_nothing(tc_caps, tmp_path):
    """The scale one host holds: 64 forked workers, each in its namespace, tc on 256 links
    of the expander under the skewed profile, nominal steps; the run ends ok and the host is
    as before (namespaces, links, qdiscs, processes)."""
    before = _host_state()
    out = tmp_path / "run"
    res = cli("run", "--topology", "expander", "--bw-profile", "skewed", "--workers", "64",
              "--rounds", "2", "--local-steps", "1", "--step-time-s", "0.5", "--no-probe",
              *TINY, "--set", "data.eval_batches=1", "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stderr
    s = load(out, "summary.json")
    assert s["status"] == "ok" and s["workers"] == 64 and s["shaper"] == "tc"
    assert len(load(out, "links.json")["links"]) == 64 * 4
    assert _host_state() == before
    left = subprocess.run(["pgrep", "-f", "emulator.zygote|emulator.worker_process"],
                          capture_output=True, text=True).stdout.split()
    assert not left, left


def test_int8_moves_a_quarter_of_the_bytes_and_its_rounds_shrink_as_predicted(tc_caps, tmp_path):
    """comm.codec = int8 on 8 Mbit/s tc links: a quarter of the bytes (within 5 %), and rounds
    shorter by what the simulator predicts for the smaller messages."""
    args = ["--topology", "ring", "--workers", "4", "--rounds", "4", "--local-steps", "2",
            "--step-time-s", "0.02", "--bw-profile", "uniform", "--rate-mbit", "8", *TINY]
    got = {}
    for codec in ("none", "int8"):
        ran, sim = tmp_path / f"run-{codec}", tmp_path / f"sim-{codec}"
        res = cli("run", *args, "--no-probe", "--codec", codec, "--out", str(ran))
        assert res.returncode == 0, res.stderr
        simulate(build_plan(resolve(overrides={  # in process: the same settings as the run
            "topology.name": "ring", "workers": 4, "run.rounds": 4, "algo.local_steps": 2,
            "compute.step_time_s": 0.02, "net.bw_profile": "uniform", "net.rate_mbit": 8.0,
            "model.preset": "tiny", "data.max_corpus_mb": 1, "comm.codec": codec,
            "run.dashboard": "off"})), sim)
        s = load(ran, "summary.json")
        assert s["status"] == "ok" and s["shaper"] == "tc"
        for lk in load(ran, "links.json")["links"]:  # what each link delivered while training
            assert 0.6 * 8 < lk["training_goodput_mbit"] <= 1.1 * 8, lk
        got[codec] = (s["bytes_sent_total"], sorted(waiting_times(ran))[1],
                      sorted(waiting_times(sim))[1], s["comm"]["raw_bytes_sent_total"])
    (b_none, t_none, p_none, _), (b_int8, t_int8, p_int8, raw) = got["none"], got["int8"]
    assert b_int8 / b_none == pytest.approx(0.25, rel=0.05)
    assert raw == b_none  # what the frames stood for: the same float32 model
    # the time a round saves is the time the link saves, as predicted (here 0.36 s of 0.52 s);
    # each round's compute, as each run measured it, is taken out first (waiting_times)
    assert t_none - t_int8 == pytest.approx(p_none - p_int8, rel=0.15)
    assert t_int8 < 0.5 * t_none


def test_a_saturated_5_mbit_link_reads_its_rate_on_the_dashboard_and_in_links_json(
        tc_caps, tmp_path):
    """A ring of 4 whose links carry the tiny model (482 kB: 0.77 s at 5 Mbit/s) every round
    (10 ms of compute a round): every reading of the dashboard's "sending at" (the rate while
    the link carries a message) on every ring link is 4.5-5.5 Mbit/s, and links.json's goodput
    while training is within 5 % of 5 Mbit/s. Its "last 3 s" (what arrived in the window) is
    lower: the link idles while its ends compute and wait, and arrivals come a whole 0.77 s
    message at a time."""
    from contextlib import contextmanager

    from gasloc_emu.emulator.launcher import launch
    from gasloc_emu.report.dashboard_state import DashboardState, Header
    from gasloc_emu.report.records import new_run_dir
    cfg = resolve(overrides={
        "topology.name": "ring", "workers": 4, "run.rounds": 10, "algo.local_steps": 1,
        "compute.step_time_s": 0.01, "net.bw_profile": "uniform", "net.rate_mbit": 5.0,
        "net.probe": False, "model.preset": "tiny", "data.max_corpus_mb": 1,
        "run.eval_every": 100, "run.dashboard": "off", "net.shaper": "tc"})
    seen: list[tuple[float, list[dict]]] = []

    @contextmanager
    def capture(devices, shaper):
        yield lambda ev: seen.append((time.monotonic(), ev["links"])) \
            if ev.get("kind") == "links" else None

    out = tmp_path / "r"
    result = launch(build_plan(cfg), new_run_dir(cfg, out), progress_factory=capture)
    assert result.code == 0, result.summary
    ring = {(a, (a + 1) % 4) for a in range(4)} | {((a + 1) % 4, a) for a in range(4)}
    state = DashboardState(Header(workers=4, rounds=10), top_links=8)
    readings = []
    for _, links in seen:
        state.update({"kind": "links", "links": links})
        readings += [(lk.src, lk.dst, lk.sending_mbit) for lk in state.snapshot().links
                     if (lk.src, lk.dst) in ring and lk.sending_mbit is not None]
    assert {(s, d) for s, d, _ in readings} == ring and len(readings) >= 3 * len(ring), seen
    off = [r for r in readings if not 4.5 <= r[2] <= 5.5]
    assert not off, off
    for lk in load(out, "links.json")["links"]:
        assert lk["training_goodput_mbit"] == pytest.approx(5.0, rel=0.05), lk
