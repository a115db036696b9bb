"""`gasloc-emu export`: CSV rows with the columns of metrics.jsonl, tokens per second and MFU
from the model's FLOPs, TensorBoard scalars where the package is installed, v1 records."""
from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gasloc_emu.commands.cli import main
from gasloc_emu.report import export as E
from gasloc_emu.report.compare import load_run
from gasloc_emu.report.schema import MetricRow

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = {"model": {"preset": "tiny"}}


def _record(tmp_path: Path, rows: list[dict]) -> Path:
    (tmp_path / "config.toml").write_text('[model]\npreset = "tiny"\n')
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def _row(worker: int, rnd: int, **more) -> dict:
    return {"worker": worker, "round": rnd, "step": 4 * (rnd + 1), "train_loss": 3.0,
            "compute_s": 0.5, "comm_s": 0.1, "wait_s": 0.0, "bytes_sent": 10, "bytes_recv": 10,
            "peers": [1 - worker], "time_s": rnd + 1.0} | more


def test_flops_per_token_is_6n_plus_attention_for_tiny():
    fm = E.flop_model(TINY, peak_tflops=1.0)
    # tiny: 2 layers, width 64, context 64, 256 byte tokens (model.gpt_num_params)
    assert fm.params == 256 * 64 + 64 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64
    assert fm.attention == 12 * 2 * 64 * 64
    assert fm.per_token == 6 * fm.params + fm.attention
    assert fm.mfu(1000.0) == pytest.approx(fm.per_token * 1000.0 / 1e12)


def test_csv_has_the_rows_columns_and_the_derived_ones(tmp_path):
    rec = _record(tmp_path, [_row(0, 0, tokens=2048), _row(1, 0, tokens=2048, lr=5e-4),
                             _row(0, 1)])
    out = CliRunner().invoke(main, ["export", str(rec), "--peak-tflops", "2"])
    assert out.exit_code == 0, out.output
    with open(rec / "metrics.csv") as f:
        got = list(csv.DictReader(f))
    assert tuple(got[0]) == E.COLUMNS
    assert [f.name for f in dataclasses.fields(MetricRow)] == list(E.COLUMNS[:-2])
    assert float(got[0]["tokens_per_s"]) == pytest.approx(4096.0)      # 2048 tokens / 0.5 s
    fm = E.flop_model(TINY, 2.0)
    assert float(got[0]["mfu"]) == pytest.approx(fm.per_token * 4096.0 / 2e12)
    assert got[1]["lr"] == "0.0005" and got[0]["lr"] == ""              # not recorded: empty
    assert got[2]["tokens_per_s"] == "" and got[2]["mfu"] == ""         # no tokens recorded
    assert json.loads(got[0]["peers"]) == [1]


@pytest.mark.parametrize("name", ["record_v1_run", "record_v1_simulate"])
def test_v1_records_export_with_empty_new_columns(tmp_path, name):
    rec = tmp_path / name
    shutil.copytree(DATA / name, rec)
    (rec / "config.toml").write_text('[model]\npreset = "tiny"\n')
    rows = E.table(load_run(rec), E.flop_model(TINY))
    assert rows and all(r["tokens_per_s"] is None and r["tokens"] is None for r in rows)
    assert E.write_csv(rows, tmp_path / "out.csv") == len(rows)


def test_a_record_without_rows_and_a_bad_peak_are_one_line(tmp_path):
    rec = _record(tmp_path, [])
    out = CliRunner().invoke(main, ["export", str(rec)])
    assert out.exit_code == 2 and "no metrics rows" in out.output
    with pytest.raises(E.ExportError, match="peak-tflops"):
        E.flop_model(TINY, 0.0)


def test_tensorboard_without_the_package_is_one_line(tmp_path, monkeypatch):
    import builtins
    real = builtins.__import__

    def no_tensorboard(name, *a, **kw):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError(name)
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with pytest.raises(E.ExportError, match=r"pip install 'gasloc-emu\[tensorboard\]'"):
        E.write_tensorboard([{"worker": 0, "round": 0, "train_loss": 1.0}], tmp_path)


def test_tensorboard_scalars_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    (tmp_path / "rec").mkdir()
    rec = _record(tmp_path / "rec", [_row(0, 0, tokens=1000), _row(0, 1, tokens=3000)])
    rows = E.table(load_run(rec), E.flop_model(TINY))
    assert E.write_tensorboard(rows, tmp_path / "tb") > 0
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    got = [(e.step, e.value) for e in acc.Scalars("worker0/tokens_per_s")]
    assert got == [(0, pytest.approx(2000.0)), (1, pytest.approx(6000.0))]
