"""Reading run folders up to their damage, and the comparison table, run view and plot errors."""
from __future__ import annotations

import io
import json
import sys

import pytest
from rich.console import Console

from gasloc_emu.report.compare import (
    CompareError,
    PlotUnavailable,
    compare_table,
    final_eval,
    load_run,
    plot,
    round_means,
    show_run,
    time_to_target,
)

CONFIG = """\
seed = 0
workers = 2

[algo]
name = "diloco"

[net]
bw_profile = "uniform"

[run]
rounds = 4
"""


def rows(rounds=3, workers=2, evals=True):
    out = []
    for r in range(rounds):
        for w in range(workers):
            row = {"worker": w, "round": r, "step": 10 * (r + 1), "train_loss": 5.0 - r - w / 10,
                   "compute_s": 1.0, "comm_s": 0.5, "wait_s": 0.1, "bytes_sent": 1000,
                   "bytes_recv": 1000, "peers": [1 - w], "time_s": 2.0 * r + 1.5 + w}
            if evals:
                row["eval_loss"] = 4.5 - r + w / 10
            out.append(row)
    return out


def make_run(path, metrics=None, summary=None, config=CONFIG, links=None):
    path.mkdir(parents=True, exist_ok=True)
    if metrics is not None:
        (path / "metrics.jsonl").write_text(
            metrics if isinstance(metrics, str) else "".join(json.dumps(r) + "\n" for r in metrics))
    if summary is not None:
        (path / "summary.json").write_text(
            summary if isinstance(summary, str) else json.dumps(summary))
    if config is not None:
        (path / "config.toml").write_text(config)
    if links is not None:
        (path / "links.json").write_text(json.dumps(links))
    return path


SUMMARY = {"status": "ok", "mode": "simulate", "algorithm": "diloco",
           "topology": "ring-allreduce", "workers": 2, "rounds": 3, "final_eval_loss": 2.25,
           "worker_eval_loss": [2.25, 2.25], "consensus_distance": 0.0,
           "bytes_sent_total": 6_000_000, "wall_s": 12.5, "predicted_wall_s": None}


def as_text(renderable) -> str:
    console = Console(record=True, width=160, force_terminal=False, color_system=None,
                      file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_a_whole_run_reads_without_warnings(tmp_path):
    run = load_run(make_run(tmp_path / "ok", rows(), SUMMARY))
    assert run.warnings == []
    assert len(run.rows) == 6 and run.rounds_done == 3 and run.rounds_planned == 3
    assert (run.name, run.algorithm, run.topology, run.profile) == (
        "ok", "diloco", "ring-allreduce", "uniform")
    assert run.label == "ok (diloco/ring-allreduce)"


def test_a_cut_off_last_line_is_dropped_with_a_warning(tmp_path):
    text = "".join(json.dumps(r) + "\n" for r in rows()) + '{"worker": 0, "round": 3, "st'
    run = load_run(make_run(tmp_path / "cut", text, SUMMARY))
    assert len(run.rows) == 6
    assert run.warnings == ["metrics.jsonl: the last line is cut off (line 7), ignored"]


def test_garbage_lines_are_skipped_and_counted(tmp_path):
    good = [json.dumps(r) for r in rows()]
    text = "\n".join(good[:2] + ["\x00\x01garbage", "[1, 2]", '{"round": 1}'] + good[2:]) + "\n"
    run = load_run(make_run(tmp_path / "junk", text, SUMMARY))
    assert len(run.rows) == 6
    assert run.warnings == ["metrics.jsonl: 3 unreadable line(s) skipped (line 3, 4, 5)"]


def test_a_missing_summary_falls_back_to_the_metrics(tmp_path):
    run = load_run(make_run(tmp_path / "killed", rows()))
    assert any(w.startswith("no summary.json") for w in run.warnings)
    assert final_eval(run) == (pytest.approx(2.55), True)  # round 3: mean of 2.5 and 2.6
    assert run.bytes_sent == 6000 and run.rounds_planned == 4
    text = as_text(compare_table([run]))
    assert "~2.5500" in text and "3/4" in text and "no final evaluation" in text


def test_a_dilated_run_says_its_k_and_that_its_seconds_are_emulated(tmp_path):
    plain = load_run(make_run(tmp_path / "k1", rows(), SUMMARY))
    dilated = load_run(make_run(tmp_path / "k4", rows(), SUMMARY | {"time_scale": 4.0}))
    text = as_text(compare_table([plain]))
    assert "emulated" not in text
    text = as_text(compare_table([plain, dilated]))
    k_column = [line.split()[8] for line in text.splitlines()
                if line.split()[:1] in (["k1"], ["k4"]) and len(line.split()) > 8]
    assert k_column == ["1", "4"]
    assert "its seconds are emulated (wall / K)" in text


def test_a_corrupt_summary_and_config_are_warnings(tmp_path):
    run = load_run(make_run(tmp_path / "bad", rows(), '{"status": "ok", ', config="= nope"))
    assert run.summary == {} and run.config == {}
    assert any(w.startswith("summary.json is unreadable") for w in run.warnings)
    assert any("not valid TOML" in w for w in run.warnings)


def test_a_failed_run_says_why(tmp_path):
    run = load_run(make_run(tmp_path / "failed", rows(1),
                            {"status": "failed", "error": "worker 1 lost", "mode": "run"}))
    assert "the run failed: worker 1 lost" in run.warnings


def test_an_empty_folder_is_all_warnings_and_still_shows(tmp_path):
    run = load_run(make_run(tmp_path / "empty", config=None))
    assert len(run.warnings) == 3 and run.rows == [] and run.algorithm == "?"
    assert "empty" in as_text(compare_table([run]))
    assert "no metrics.jsonl" in as_text(show_run(run))


def test_a_missing_folder_is_an_error(tmp_path):
    with pytest.raises(CompareError, match="no such run folder"):
        load_run(tmp_path / "nope")


def test_round_means_average_workers_and_take_the_last_time():
    points = round_means(rows(2), "eval_loss")
    assert [(p.round, p.value, p.time_s) for p in points] == [
        (1, pytest.approx(4.55), 2.5), (2, pytest.approx(3.55), 4.5)]


def test_time_to_target_is_the_first_round_at_or_below_it(tmp_path):
    run = load_run(make_run(tmp_path / "t", rows(), SUMMARY))
    assert time_to_target(run, 3.55) == 4.5
    assert time_to_target(run, 1.0) is None


def test_the_table_lists_each_run(tmp_path):
    a = load_run(make_run(tmp_path / "run-a", rows(), SUMMARY))
    b = load_run(make_run(tmp_path / "run-b", rows(evals=False),
                          dict(SUMMARY, algorithm="gasloc", topology="torus", wall_s=3.0)))
    text = as_text(compare_table([a, b], target_loss=3.6))
    header = next(line for line in text.splitlines() if "algorithm" in line)
    for col in ("run", "topology", "profile", "rounds", "final eval", "wall s", "clock s",
                "bytes sent", "s to eval ≤ 3.6"):
        assert col in header
    line_a = next(line for line in text.splitlines() if "run-a" in line).split()
    assert line_a == ["run-a", "diloco", "ring-allreduce", "uniform", "3", "2.2500", "12.5",
                      "6.50", "1", "6.00", "MB", "4.50"]
    line_b = next(line for line in text.splitlines() if "run-b" in line)
    assert "gasloc" in line_b and "torus" in line_b and "not reached" in line_b


def test_show_run_flags_links_off_by_more_than_ten_percent(tmp_path):
    links = {"links": [
        {"src": 0, "dst": 1, "configured_mbit": 50.0, "measured_mbit": 48.0, "latency_ms": 5.0,
         "measured_latency_ms": 5.2, "ok": True},
        {"src": 1, "dst": 0, "configured_mbit": 50.0, "measured_mbit": 30.0, "latency_ms": 5.0,
         "measured_latency_ms": 5.1},
        {"src": 1, "dst": 2, "configured_mbit": 5.0, "measured_mbit": None}]}
    run = load_run(make_run(tmp_path / "net", rows(), dict(SUMMARY, shaper="tc"), links=links))
    lines = as_text(show_run(run)).splitlines()
    by_link = {ln.split()[0]: ln for ln in lines if "→" in ln}
    assert by_link["0→1"].rstrip().endswith("ok") and "-4%" in by_link["0→1"]
    assert by_link["1→0"].rstrip().endswith("MISS") and "-40%" in by_link["1→0"]
    assert by_link["1→2"].rstrip().endswith("-")
    assert any("shaper" in ln and "tc" in ln for ln in lines)  # later summary keys shown too


def test_links_json_may_be_a_plain_list(tmp_path):
    run = load_run(make_run(tmp_path / "l", rows(), SUMMARY,
                            links=[{"src": 0, "dst": 1, "configured_mbit": 5.0}]))
    assert run.links == [{"src": 0, "dst": 1, "configured_mbit": 5.0}]


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    run = load_run(make_run(tmp_path / "p", rows(), SUMMARY))
    with pytest.raises(PlotUnavailable, match=r"pip install 'gasloc-emu\[plot\]'"):
        plot([run], tmp_path / "x.png")


def test_plot_of_runs_without_losses_is_an_error(tmp_path):
    run = load_run(make_run(tmp_path / "e"))
    with pytest.raises(CompareError, match="nothing to plot"):
        plot([run], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_show_names_each_links_regions_from_the_recorded_placement(tmp_path):
    """`show RUN` of a cloud run: each link with its workers' regions, read from config.toml's
    net.placement; an unreadable placement is a warning and the links go by number."""
    config = CONFIG.replace('bw_profile = "uniform"', 'bw_profile = "cloud"\n'
                            'placement = "aws:us-east-1,gcp:asia-east1"')
    links = [{"src": 0, "dst": 1, "configured_mbit": 280.0, "measured_mbit": 279.0},
             {"src": 1, "dst": 0, "configured_mbit": 300.0, "measured_mbit": 301.0}]
    run = load_run(make_run(tmp_path / "cloud", rows(), SUMMARY, config=config, links=links))
    assert run.regions == ("aws:us-east-1", "gcp:asia-east1") and run.warnings == []
    text = as_text(show_run(run))
    assert "0 aws:us-east-1 → 1 gcp:asia-east1" in text
    assert "1 gcp:asia-east1 → 0 aws:us-east-1" in text
    bad = load_run(make_run(tmp_path / "bad", rows(), SUMMARY, links=links,
                            config=config.replace("gcp:asia-east1", "gcp:nowhere-1")))
    assert bad.regions == () and any("net.placement is unreadable" in w for w in bad.warnings)
    assert "0→1" in as_text(show_run(bad))
