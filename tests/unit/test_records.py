"""Run records: never mixed, whole lines or nothing, every OSError one RecordError."""
from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest

from gasloc_emu import config as C
from gasloc_emu.report import records
from gasloc_emu.report.records import RecordError, RunRecord, new_run_dir


@pytest.fixture
def cfg():
    return C.resolve(None, {"workers": 2})


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_a_reused_out_is_refused_and_left_as_it_was(tmp_path, cfg):
    out = tmp_path / "run"
    with RunRecord(new_run_dir(cfg, out), cfg) as rec:
        rec.metric({"round": 0})
        rec.summary({"status": "ok"})
    with pytest.raises(RecordError, match="already holds a run record.*--overwrite"):
        new_run_dir(cfg, out)
    assert _lines(out) == [{"round": 0}]


def test_overwrite_clears_the_old_record_but_not_other_files(tmp_path, cfg):
    out = tmp_path / "run"
    with RunRecord(new_run_dir(cfg, out), cfg) as rec:
        rec.metric({"round": 0})
    (out / "notes.txt").write_text("mine")
    (out / "workers").mkdir()
    with RunRecord(new_run_dir(cfg, out, overwrite=True), cfg) as rec:
        rec.metric({"round": 7})
    assert _lines(out) == [{"round": 7}]
    assert (out / "notes.txt").read_text() == "mine" and not (out / "workers").exists()


def test_an_empty_existing_folder_is_fine(tmp_path, cfg):
    (tmp_path / "empty").mkdir()
    assert new_run_dir(cfg, tmp_path / "empty") == tmp_path / "empty"


def test_a_file_where_the_folder_should_be_is_one_record_error(tmp_path, cfg):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RecordError, match="cannot create the run record"):
        new_run_dir(cfg, tmp_path / "f" / "run")


def test_a_read_only_folder_is_one_record_error(tmp_path, cfg, monkeypatch):
    """Root writes into read-only folders, and CI runs as root: the kernel's refusal is injected
    (every mkdir and open under the folder raises EACCES) so that the test holds for any user."""
    tmp_path.chmod(0o500)
    real_mkdir, real_open = os.mkdir, os.open

    def refused(real):
        def call(path, *args, **kw):
            if tmp_path in Path(os.fsdecode(path)).parents:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
            return real(path, *args, **kw)
        return call

    monkeypatch.setattr(os, "mkdir", refused(real_mkdir))
    monkeypatch.setattr(os, "open", refused(real_open))
    try:
        where = re.escape(str(tmp_path / "run"))
        with pytest.raises(RecordError, match=f"cannot write {where}.*Permission denied"):
            RunRecord(tmp_path / "run", cfg)
    finally:
        tmp_path.chmod(0o700)
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_takes_back_the_cut_line(tmp_path, cfg, monkeypatch):
    rec = RunRecord(tmp_path, cfg)
    rec.metric({"round": 0, "loss": 1.5})
    real_write = os.write

    def half_write(fd, data):  # the disk fills in the middle of the line
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(records.os, "write", half_write)
    with pytest.raises(RecordError, match="metrics.jsonl"):
        rec.metric({"round": 1, "loss": 1.25})
    monkeypatch.setattr(records.os, "write", real_write)
    rec.metric({"round": 2})
    rec.close()
    assert _lines(tmp_path) == [{"round": 0, "loss": 1.5}, {"round": 2}]


def test_enospc_is_a_record_error_and_no_partial_line(tmp_path, cfg, monkeypatch):
    rec = RunRecord(tmp_path, cfg)

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records.os, "write", full)
    with pytest.raises(RecordError, match="No space left on device"):
        rec.metric({"round": 0})
    rec.close()
    assert (tmp_path / "metrics.jsonl").read_bytes() == b""


def test_a_summary_that_cannot_be_written_leaves_no_temporary(tmp_path, cfg, monkeypatch):
    rec = RunRecord(tmp_path, cfg)
    monkeypatch.setattr(records.Path, "replace", lambda self, target: (_ for _ in ()).throw(
        OSError(errno.EROFS, "Read-only file system")))
    with pytest.raises(RecordError, match="summary.json: Read-only file system"):
        rec.summary({"status": "ok"})
    assert not list(tmp_path.glob("*.tmp"))
