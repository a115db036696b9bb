"""The run record's schemas: records written before versions existed still read, a future
version is refused in one line, unknown keys are refused, and what is written reads back equal."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gasloc_emu.config import Config
from gasloc_emu.report.compare import load_run
from gasloc_emu.report.records import RunRecord
from gasloc_emu.report.schema import (
    OLDEST_VERSION,
    SCHEMA_VERSION,
    LinkRow,
    MetricRow,
    RunSummary,
    SchemaError,
    read_links,
)

DATA = Path(__file__).resolve().parents[1] / "data"
V1_RECORDS = ("record_v1_run", "record_v1_simulate")   # written by gasloc-emu before versions


def _json(path: Path):
    return json.loads(path.read_text())


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name", V1_RECORDS)
def test_a_version_1_record_reads_and_writes_back_the_same_keys(name):
    folder = DATA / name
    summary = _json(folder / "summary.json")
    assert "schema_version" not in summary   # a real record of the version before this one
    back = RunSummary.from_json(summary)
    assert back.schema_version == SCHEMA_VERSION and back.status == "ok"
    assert back.to_json() == {"schema_version": SCHEMA_VERSION, **summary}
    for row in _rows(folder / "metrics.jsonl"):
        assert MetricRow.from_json(row).body() == row
    links = _json(folder / "links.json")
    assert [r.to_json() for r in read_links(links)] == links["links"]


def test_a_version_1_summary_reads_its_values_and_defaults_what_it_lacks():
    summary = _json(DATA / "record_v1_run" / "summary.json")
    s = RunSummary.from_json(summary)
    assert s.final_eval_loss == summary["final_eval_loss"] and s.shaper == "tc"
    assert s.predicted_wall_s is None and s["predicted_wall_s"] is None   # null, written
    assert s.membership is None and "membership" not in s   # absent: the default, not written
    older = {k: v for k, v in summary.items() if k not in ("comm", "host_cpu")}
    assert RunSummary.from_json(older).comm is None   # a key an older record lacks


@pytest.mark.parametrize("record, obj", [
    (RunSummary, {"status": "ok", "schema_version": SCHEMA_VERSION + 1}),
    (MetricRow, {"schema_version": 99, "worker": 0}),
])
def test_a_future_version_is_refused_naming_it_and_the_range(record, obj):
    with pytest.raises(SchemaError) as info:
        record.from_json(obj)
    text = str(info.value)
    assert "\n" not in text and f"schema_version {obj['schema_version']}" in text
    assert f"versions {OLDEST_VERSION} to {SCHEMA_VERSION}" in text


def test_links_json_carries_its_version_beside_the_rows():
    with pytest.raises(SchemaError, match=f"links.json: schema_version {SCHEMA_VERSION + 1} "):
        read_links({"schema_version": SCHEMA_VERSION + 1, "links": []})
    with pytest.raises(SchemaError, match="schema_version 0 "):
        LinkRow.from_json({"src": 0, "dst": 1, "bytes": 5}, version=0)


def test_unknown_and_missing_keys_are_refused_by_name():
    with pytest.raises(SchemaError, match=r"unknown key\(s\) \['final_loss'\]"):
        RunSummary.from_json({"status": "ok", "final_loss": 1.0})
    with pytest.raises(SchemaError, match=r"missing required key\(s\) \['status'\]"):
        RunSummary.from_json({"mode": "run"})
    with pytest.raises(SchemaError, match="status = 'fine' is not one of"):
        RunSummary.of({"status": "fine"})
    with pytest.raises(SchemaError, match="dst"):
        LinkRow.of({"src": 0, "bytes": 1})


def test_a_summary_changed_with_or_is_checked_and_reads_as_its_json():
    ended = RunSummary.ended("failed", "worker 1 died", mode="run")
    assert ended.to_json() == {"schema_version": SCHEMA_VERSION, "status": "failed",
                               "error": "worker 1 died", "mode": "run"}
    more = ended | {"last_rounds": [3, 2]}
    assert more["last_rounds"] == [3, 2] and more.get("algorithm") is None
    assert more == more.to_json() and ended != more
    with pytest.raises(SchemaError, match="unknown key"):
        ended | {"lastrounds": [3]}


def test_a_row_built_from_a_round_reads_back_equal():
    stats = {"worker": 1, "round": 2, "step": 30, "train_loss": float("nan"), "compute_s": 1.0,
             "comm_s": 0.5, "wait_s": 0.1, "bytes_sent": 10, "bytes_recv": 12, "peers": [0],
             "steps": 10, "speed": 1.0, "overruns": 0, "overrun_ratio": 0.0}
    row = MetricRow.from_round(stats, time_s=4.5, dropped=0)
    js = row.to_json()
    assert js["schema_version"] == SCHEMA_VERSION and js["train_loss"] is None  # JSON: no NaN
    assert "eval_loss" not in js and row["time_s"] == 4.5
    assert MetricRow.from_json(json.loads(json.dumps(js))).to_json() == js


def test_the_record_writes_versions_and_compare_reads_them(tmp_path):
    stats = {"worker": 0, "round": 0, "step": 5, "train_loss": 3.0, "compute_s": 1.0,
             "comm_s": 0.5, "wait_s": 0.1, "bytes_sent": 10, "bytes_recv": 12, "peers": [1],
             "time_s": 1.5}
    with RunRecord(tmp_path / "r", Config()) as rec:
        rec.metric(MetricRow.from_round(stats))
        rec.summary(RunSummary.ended("stopped", "interrupted (Ctrl-C)", mode="simulate"))
        rec.write_json("links.json", {"shaper": "simulate",
                                      "links": [LinkRow.moved(0, 1, 10, 40)]})
    assert _json(tmp_path / "r" / "summary.json")["schema_version"] == SCHEMA_VERSION
    assert _rows(tmp_path / "r" / "metrics.jsonl")[0]["schema_version"] == SCHEMA_VERSION
    links = _json(tmp_path / "r" / "links.json")
    assert links["schema_version"] == SCHEMA_VERSION
    assert links["links"] == [{"src": 0, "dst": 1, "bytes": 10, "raw_bytes": 40}]
    run = load_run(tmp_path / "r")
    assert run.summary.status == "stopped" and run.rows[0].step == 5


def test_compare_says_which_version_it_cannot_read(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"worker": 0, "round": 0,
                                                        "schema_version": 7}) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"status": "ok", "schema_version": 7}))
    run = load_run(tmp_path)
    assert run.summary == {} and run.rows == []
    assert sum("schema_version 7 is not supported" in w for w in run.warnings) == 2


def test_records_page_is_rendered_from_the_schemas():
    """docs/RECORDS.md is what render_records makes of the dataclasses: a field added, removed
    or redescribed in report/schema.py without the page fails here
    (python -c "from gasloc_emu.report.schema import render_records;
    open('docs/RECORDS.md', 'w').write(render_records())" writes it)."""
    from gasloc_emu.report.schema import RECORDS, render_records
    page = (Path(__file__).resolve().parents[2] / "docs" / "RECORDS.md").read_text()
    assert page == render_records()
    for cls in RECORDS:
        assert all(f"| `{f.name}` |" in page for f in dataclasses.fields(cls)), cls
