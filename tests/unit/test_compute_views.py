"""Where the compute model shows: the dashboard's worker columns and overrun warnings, the time
per worker in compare and show, and the heartbeat fields the launcher accepts."""
from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from gasloc_emu.report import compare as K
from gasloc_emu.report.dashboard import render
from gasloc_emu.report.dashboard_state import DashboardState, Header
from gasloc_emu.transport import control
from gasloc_emu.transport.control import ControlError, Expect

HEADER = Header(algorithm="diloco", topology="ring-allreduce", workers=2, rounds=4,
                compute="straggler, step 0.05 s", step_time_s=0.05)


def as_text(renderable, width=140) -> str:
    console = Console(record=True, width=width, force_terminal=False, color_system=None,
                      file=io.StringIO())
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def row(worker, rnd, compute_s, comm_s, wait_s, steps=10, speed=1.0, **extra):
    return {"worker": worker, "round": rnd, "step": 10 * (rnd + 1), "train_loss": 4.0,
            "compute_s": compute_s, "comm_s": comm_s, "wait_s": wait_s, "bytes_sent": 10,
            "bytes_recv": 10, "peers": [1 - worker], "time_s": 2.0 * (rnd + 1), "steps": steps,
            "speed": speed, "overruns": 0, "overrun_ratio": 0.5, **extra}


def straggler_rows(rounds=2):
    """Worker 0 at full speed waits 1.5 s a round for worker 1, at speed 0.25."""
    return [r for t in range(rounds) for r in (row(0, t, 0.5, 1.5, 1.5),
                                               row(1, t, 2.0, 0.01, 0.0, steps=2, speed=0.25))]


# ---------------------------------------------------------------- dashboard

def test_the_dashboard_shows_speed_steps_and_waiting_per_worker():
    st = DashboardState(HEADER, start=0.0)
    for r in straggler_rows():
        st.update(r, now=1.0)
    text = as_text(render(st.snapshot(1.0)))
    assert "compute straggler, step 0.05 s" in text
    header = next(line for line in text.splitlines() if "worker" in line and "speed" in line)
    assert header.split() == ["worker", "device", "round", "step", "speed", "steps/round",
                              "waiting", "train", "loss", "tokens/s", "state"]
    w0 = next(line for line in text.splitlines() if line.split()[:1] == ["0"]).split()
    w1 = next(line for line in text.splitlines() if line.split()[:1] == ["1"]).split()
    assert w0[4:8] == ["1.00", "10", "75", "%"] and w1[4:8] == ["0.25", "2", "0", "%"]


def test_heartbeat_fields_update_the_worker_between_rounds():
    st = DashboardState(HEADER, start=0.0)
    st.update({"kind": "status", "worker": 1, "state": "computing", "speed": 0.25,
               "round_steps": 3, "wait_share": 0.4}, now=1.0)
    w = st.snapshot(1.0).workers[1]
    assert (w.speed, w.round_steps, w.wait_share) == (0.25, 3, 0.4)


def test_overruns_warn_and_say_whether_the_round_ran_late():
    st = DashboardState(HEADER, start=0.0)
    st.update(row(0, 0, 0.5, 0.0, 0.0, overruns=2, overrun_ratio=1.8), now=1.0)
    warnings = st.snapshot(1.0).warnings
    assert warnings == ("worker 0: 2 inner step(s) slower than their nominal time so far "
                        "(worst 1.80×); later steps caught up",)
    st.update(row(0, 1, 0.62, 0.0, 0.0, overruns=10, overrun_ratio=1.3), now=2.0)
    assert st.snapshot(2.0).warnings == (
        "worker 0: 12 inner step(s) slower than their nominal time so far (worst 1.80×); "
        "round 2 ran 0.12 s late: the host is too slow for this compute.step_time_s",)


def test_rows_without_the_compute_fields_leave_the_columns_out():
    st = DashboardState(Header(workers=1, rounds=2), start=0.0)
    old = {k: v for k, v in row(0, 0, 0.5, 0.1, 0.0).items()
           if k not in ("steps", "speed", "overruns", "overrun_ratio")}
    st.update(old, now=1.0)
    assert "speed" not in as_text(render(st.snapshot(1.0)))


# ---------------------------------------------------------------- compare and show

def make_run(path, rows):
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return K.load_run(path)


def test_worker_times_sum_computing_sending_and_waiting():
    times = K.worker_times(straggler_rows())
    assert [(t.worker, t.rounds, t.steps, t.speed) for t in times] == \
        [(0, 2, 20, 1.0), (1, 2, 4, 0.25)]
    assert (times[0].computing_s, times[0].sending_s, times[0].waiting_s) == (1.0, 0.0, 3.0)
    assert times[1].sending_s == pytest.approx(0.02)
    assert times[0].share(times[0].waiting_s) == pytest.approx(0.75)


def test_a_slow_worker_and_slow_links_are_told_apart():
    assert K.bottleneck(K.worker_times(straggler_rows())).startswith(
        "worker 1's compute (it waits 0% of its time, the others 75%)")
    links = [row(w, t, 0.5, 1.5, 1.4) for t in range(2) for w in range(2)]
    assert K.bottleneck(K.worker_times(links)) == \
        "communication (the workers send or wait 75% of their time)"
    busy = [row(w, t, 0.5, 0.01, 0.01) for t in range(2) for w in range(2)]
    assert K.bottleneck(K.worker_times(busy)).startswith("compute, evenly")
    assert K.bottleneck([]) == "nothing recorded"


def test_compare_and_show_print_the_time_per_worker(tmp_path):
    run = make_run(tmp_path / "strag", straggler_rows())
    for text in (as_text(K.compare_table([run])), as_text(K.show_run(run))):
        assert "time per worker" in text and "bound by worker 1's compute" in text
        line = next(ln for ln in text.splitlines() if ln.split()[:2] == ["strag", "1"]).split()
        assert line[2:] == ["0.25", "4", "4.00", "0.02", "0.00", "0%"]


# ---------------------------------------------------------------- the launcher's allow-list

EXPECT = Expect(workers=4, rounds=5, numel=6)
BEAT = {"type": "hb", "worker": 1, "round": 2, "step": 30, "state": "computing", "peer": None,
        "sent": {}, "dropped": 0, "drop_reasons": {}}


def test_heartbeats_carry_speed_steps_and_wait_share():
    hb = control.parse(BEAT | {"speed": 0.25, "round_steps": 2, "wait_share": 0.5}, EXPECT)
    assert (hb.speed, hb.round_steps, hb.wait_share) == (0.25, 2, 0.5)
    none = control.parse(BEAT | {"speed": None, "round_steps": None, "wait_share": None}, EXPECT)
    assert (none.speed, none.round_steps, none.wait_share) == (None, None, None)


@pytest.mark.parametrize("field, value", [("speed", 0.0), ("speed", 1.5), ("speed", True),
                                          ("round_steps", -1), ("round_steps", 2.0),
                                          ("wait_share", 1.01), ("wait_share", float("nan"))])
def test_bad_compute_fields_are_refused_with_their_reason(field, value):
    with pytest.raises(ControlError) as info:
        control.parse(BEAT | {field: value}, EXPECT)
    assert info.value.reason == f"hb.{field}"


def test_what_a_worker_reports_is_accepted():
    """The producers: a RoundStats row and WorkerState.status() after a round."""
    from gasloc_emu.emulator.worker_process import WorkerState
    from gasloc_emu.training.worker import RoundStats
    stats = RoundStats(1, 2, 12, 3.0, 2.0, 0.5, 0.25, 10, 10, [0, 2], steps=2, speed=0.25,
                       overruns=1, overrun_ratio=1.25)
    row_ = stats.as_dict() | {"time_s": 9.0, "dropped": 0}
    assert control.parse({"type": "metric", "worker": 1, "row": row_}, EXPECT).row == row_
    state = WorkerState(2, 12, "computing", speed=0.25)
    state.finished_round(stats)
    beat = {"type": "hb", "worker": 1} | state.status()
    hb = control.decode(control.pack(beat), EXPECT)
    assert (hb.speed, hb.round_steps, hb.wait_share) == (0.25, 2, 0.1)
    bad = row_ | {"speed": 2.0}
    with pytest.raises(ControlError, match="metric.row.speed"):
        control.parse({"type": "metric", "worker": 1, "row": bad}, EXPECT)


# ---------------------------------------------------------------- the closing lines

def test_summary_lines_warn_about_overruns_only_when_there_are_some():
    from gasloc_emu.report.fmt import summary_lines
    base = {"final_eval_loss": 2.5, "consensus_distance": 0.0, "wall_s": 8.2}
    calm = summary_lines(base | {"compute": {"overruns": [0, 0]}}, "runs/x")
    assert calm == summary_lines(base, "runs/x") == summary_lines(
        base | {"compute": {"overruns": None}}, "runs/x")
    assert len(calm) == 2
    loud = summary_lines(base | {"compute": {"overruns": [1, 0, 4]}}, "runs/x")
    assert loud[2] == ("warning: 5 inner steps took longer than their nominal time (most on "
                       "worker 2: 4); see overruns in metrics.jsonl")
