"""Every way a run can end leaves a record with a status, one line on stderr and its own exit code.

0 ok, 1 failed, 2 bad input, 3 diverged, 4 internal error, 130 interrupted (gasloc_emu.exitcodes).
"""
from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gasloc_emu import config as C
from gasloc_emu import exitcodes
from gasloc_emu.emulator import launcher
from gasloc_emu.plan import build_plan
from gasloc_emu.report import records

pytestmark = pytest.mark.integration

TINY = ["--model", "tiny", "-H", "2", "--no-dashboard", "--set", "data.max_corpus_mb=0.5",
        "--set", "data.eval_batches=1"]
POISON = ["--set", "fault.worker=1", "--set", "fault.round=2", "--set", "fault.mode=poison"]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def one_line_error(done: subprocess.CompletedProcess, code: int, *words: str) -> None:
    assert done.returncode == code, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    for w in words:
        assert w in errors[0], errors[0]


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_divergence_is_not_success(tmp_path, gasloc, command):
    out = tmp_path / command
    done = gasloc(command, "-n", "3", "-R", "4", "--topology", "ring", *TINY, *POISON,
                  "--out", str(out))
    one_line_error(done, exitcodes.DIVERGED, "diverged in round 2")
    s = summary(out)
    assert s["status"] == "diverged" and s["diverged_at"]["round"] == 2
    assert s["diverged_at"]["worker"] in (0, 2)  # worker 1's neighbours take in its NaN
    assert "final_eval_loss" not in s


def test_a_reused_out_is_refused_and_overwrite_replaces_it(tmp_path, gasloc):
    out = str(tmp_path / "run")
    args = ["simulate", "-n", "2", "-R", "1", *TINY, "--out", out]
    assert gasloc(*args).returncode == 0
    first = rows(Path(out))
    one_line_error(gasloc(*args, "--seed", "5"), exitcodes.BAD_INPUT, "--overwrite")
    assert rows(Path(out)) == first
    done = gasloc(*args, "--seed", "5", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert len(rows(Path(out))) == len(first) and rows(Path(out)) != first


def test_an_out_under_a_file_is_one_line_exit_2(tmp_path, gasloc):
    (tmp_path / "file").write_text("x")
    done = gasloc("simulate", "-n", "2", "-R", "1", *TINY, "--out", str(tmp_path / "file" / "r"))
    one_line_error(done, exitcodes.BAD_INPUT, "cannot create the run record")


@pytest.mark.parametrize("extra, words", [
    (["--latency-ms", "10"], "needs a bandwidth profile"),
    (["--bw-profile", "uniform", "--shaper", "none"], "would not be applied"),
    (["--shaper", "none", "--set", "net.jitter_ms=3", "--bw-profile", "skewed"],
     "would not be applied"),
])
def test_network_settings_that_would_not_apply_are_refused(tmp_path, extra, words):
    """In this process, as tests/integration/test_cli_errors.py checks bad input (a real
    process's one line and exit code are checked there, and by the tests above)."""
    from click.testing import CliRunner

    from gasloc_emu.commands.cli import main
    for command in ("simulate", "run"):
        out = tmp_path / command
        done = CliRunner().invoke(main, [command, "-n", "2", "-R", "1", *TINY, *extra,
                                         "--out", str(out)])
        assert not isinstance(done.exception, Exception) or \
            isinstance(done.exception, SystemExit), done.exception
        one_line_error(subprocess.CompletedProcess([], done.exit_code, done.stdout,
                                                   done.stderr), exitcodes.BAD_INPUT, words)
        assert not (out / "config.toml").exists()


def _interrupt_when(args: list[str], ready, tmp_path: Path) -> subprocess.CompletedProcess:
    # a shell's background job starts with SIGINT ignored, which a child would inherit
    proc = subprocess.Popen([sys.executable, "-m", "gasloc_emu", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not ready() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def test_ctrl_c_during_imports_is_exit_130(tmp_path):
    t0 = time.monotonic()
    done = _interrupt_when(["simulate", *TINY, "--out", str(tmp_path / "r")],
                           lambda: time.monotonic() - t0 > 0.2, tmp_path)
    one_line_error(done, exitcodes.INTERRUPTED, "interrupted")


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_ctrl_c_mid_run_is_exit_130_and_a_stopped_record(tmp_path, command):
    out = tmp_path / command
    metrics = out / "metrics.jsonl"
    done = _interrupt_when([command, "-n", "2", "-R", "500", *TINY, "--out", str(out)],
                           lambda: metrics.exists() and metrics.stat().st_size > 0, tmp_path)
    one_line_error(done, exitcodes.INTERRUPTED, "interrupted")
    assert summary(out)["status"] == "stopped"
    assert all(line.endswith("}") for line in metrics.read_text().splitlines())


@pytest.fixture
def tiny_cfg():
    return C.resolve(None, {"workers": 2, "model.preset": "tiny", "algo.local_steps": 2,
                            "run.rounds": 6, "data.max_corpus_mb": 0.5,
                            "data.eval_batches": 1, "run.dashboard": "off"})


def test_an_unexpected_launcher_error_is_recorded_as_internal(tmp_path, tiny_cfg):
    class Boom:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def __call__(self, row: dict) -> None:
            if row.get("round") == 2:
                raise ZeroDivisionError("a bug in the progress display")

    path = records.new_run_dir(tiny_cfg, tmp_path / "r")
    result = launcher.launch(build_plan(tiny_cfg), path,
                             progress_factory=lambda devices, shaper: Boom(), log=lambda s: None)
    assert result.code == exitcodes.INTERNAL
    s = summary(path)
    assert s["status"] == "error" and "ZeroDivisionError: a bug" in s["error"]


def test_a_full_disk_mid_run_fails_with_whole_lines(tmp_path, tiny_cfg, monkeypatch):
    real = records.RunRecord._append
    state = {"lines": 0}

    def fill_up(self, line: bytes) -> None:
        if state["lines"] >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        state["lines"] += 1
        real(self, line)

    real_replace = records.RunRecord._replace

    def full_until_the_reserve_goes(self, name: str, text: str) -> None:
        # the disk stays full: only the space held for the summary can be given back
        if state["lines"] >= 3:   # full from the fourth metrics line on
            held = (self.path / records.RESERVE).exists()
            state["held"] = state.get("held", False) or held
            if held or name != "summary.json":
                raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(self, name, text)

    monkeypatch.setattr(records.RunRecord, "_append", fill_up)
    monkeypatch.setattr(records.RunRecord, "_replace", full_until_the_reserve_goes)
    path = records.new_run_dir(tiny_cfg, tmp_path / "r")
    result = launcher.launch(build_plan(tiny_cfg), path, log=lambda s: None)
    assert result.code == exitcodes.RUN_FAILED
    s = summary(path)
    assert s["status"] == "failed" and "No space left on device" in s["error"]
    assert len(rows(path)) == 3
    assert state["held"] and not (path / records.RESERVE).exists()  # held, then given back
