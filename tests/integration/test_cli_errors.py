"""Bad input: one clear line on stderr, exit code 2 (cli.py: '2 bad input'), never a traceback.

Most cases run the click command in-process (fast); a few run the real executable in a fresh
interpreter. Every bad command is otherwise tiny (-R 1 -H 1), so a check that wrongly lets it
through ends quickly, with exit 0, and fails the test instead of training for minutes.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from gasloc_emu.commands.cli import main

pytestmark = pytest.mark.integration

QUICK = ["--model", "tiny", "-R", "1", "--no-dashboard", "--set", "data.max_corpus_mb=0.25",
         "--set", "data.eval_batches=1"]


@pytest.fixture
def files(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "empty.bin").write_bytes(b"")
    (tmp_path / "emptydir").mkdir()
    np.array([1, 2, 3, 300, 5] * 5000, dtype=np.uint16).tofile(tmp_path / "big_tokens.bin")
    np.array(np.arange(25_000) % 256, dtype=np.uint16).tofile(tmp_path / "ok_tokens.bin")
    (tmp_path / "text.txt").write_bytes(b"some text for a tiny model. " * 2000)
    (tmp_path / "bad.toml").write_text("workers = = 4\n")
    return tmp_path


def invoke(args: list[str]):
    return CliRunner().invoke(main, args, catch_exceptions=True)


def assert_clean_error(result, *needles: str) -> None:
    out = (result.stdout or "") + (result.stderr or "")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail(f"uncaught {type(result.exception).__name__}: {result.exception}")
    assert "Traceback" not in out
    assert result.exit_code == 2, f"exit {result.exit_code}; stderr {result.stderr!r}"
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


SIMULATE_CASES = [
    (["--topology", "star"], ["topology.name", "'star'", "ring"]),
    (["--algo", "adam"], ["algo.name", "'adam'", "gasloc"]),
    (["-n", "1"], ["at least 2 workers"]),
    (["-n", "0"], ["workers", "0"]),
    (["--data", "{d}/missing.txt"], ["does not exist", "missing.txt"]),
    (["--data", "{d}/empty.txt"], ["no tokens"]),
    (["--data", "{d}/emptydir"], ["no tokens"]),
    (["--data", "{d}/empty.bin"], ["empty.bin"]),
    (["--data", "{d}/big_tokens.bin"], ["300", "256"]),
    (["--rounds", "-1"], ["run.rounds", "-1"]),
    (["--local-steps", "-3"], ["algo.local_steps", "-3"]),
    (["--local-steps", "many"], ["--local-steps", "'many'"]),
    (["--local-steps", "1,2", "-n", "4"], ["one per worker"]),
    (["--lr", "-1"], ["algo.inner.lr", "-1"]),
    (["--outer-lr", "-0.5"], ["algo.outer_lr", "-0.5"]),
    (["--momentum", "fast"], ["momentum", "'fast'"]),
    (["--set", "net.rate_mbit=-5"], ["net.rate_mbit", "-5"]),
    (["--set", "algo.bogus=1"], ["unknown setting algo.bogus"]),
    (["--set", "nonsense"], ["--set", "nonsense"]),
    (["--topology", "matching", "-n", "5"], ["even", "5"]),
    (["--topology", "matching2", "-n", "3"], ["even", "3"]),
    (["--topology", "expander", "--degree", "4", "-n", "4"], ["degree", "4"]),
    (["--topology", "expander", "--degree", "9", "-n", "6"], ["degree", "9"]),
    (["--topology", "torus", "-n", "7"], ["torus", "7"]),
    (["--algo", "dsgd", "--local-steps", "5"], ["dsgd"]),
    (["--config", "{d}/missing.toml"], ["missing.toml", "does not exist"]),
    (["--config", "{d}/bad.toml"], ["bad.toml", "not valid TOML"]),
    (["--set", "model.n_head=3"], ["n_head", "3"]),
    (["--algo", "diloco", "--momentum", "auto"], ["auto"]),
]


@pytest.mark.parametrize("extra,needles", SIMULATE_CASES,
                         ids=[" ".join(c[0]).replace("{d}/", "") for c in SIMULATE_CASES])
def test_simulate_bad_input(files, tmp_path, extra, needles):
    args = ["simulate", *QUICK, "-H", "1", "--out", str(tmp_path / "run"),
            *[a.replace("{d}", str(files)) for a in extra]]
    assert_clean_error(invoke(args), *needles)


@pytest.mark.parametrize("extra", [
    ["--data", "{d}/text.txt"],
    ["--data", "{d}/ok_tokens.bin"],
    ["--topology", "expander", "--degree", "3", "-n", "6"],
    ["--topology", "matching", "-n", "4"],
    ["--algo", "diloco", "-n", "1"],  # no gossip graph: one worker is fine
])
def test_simulate_good_input_succeeds(files, tmp_path, extra):
    """Controls: the same command line without the bad part runs and writes its record."""
    out = tmp_path / "run"
    args = ["simulate", *QUICK, "-H", "1", "--out", str(out),
            *[a.replace("{d}", str(files)) for a in extra]]
    result = invoke(args)
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert (out / "summary.json").is_file() and (out / "metrics.jsonl").is_file()
    assert "final eval loss" in result.stdout


@pytest.mark.parametrize("args,needles", [
    (["topo", "--topology", "ring", "-n", "1"], ["at least 2"]),
    (["topo", "--topology", "torus", "-n", "11"], ["torus", "11"]),
    (["topo", "--topology", "matching", "-n", "6", "--base", "star"], ["star"]),
    (["topo", "--topology", "expander", "-n", "5", "--degree", "3"], ["even"]),
    (["config", "--set", "net.rate_mbit=-5"], ["net.rate_mbit"]),
    (["config", "--topology", "hypercube"], ["topology.name", "'hypercube'"]),
    (["run", "--set", "algo.bogus=1", "--dry-run"], ["unknown setting algo.bogus"]),
])
def test_other_commands_bad_input(args, needles):
    assert_clean_error(invoke(args), *needles)


def test_topo_and_config_good_input():
    r = invoke(["topo", "--topology", "ring", "-n", "8"])
    assert r.exit_code == 0 and "symmetric: True  doubly stochastic: True" in r.stdout
    assert "lambda2 (W) = 0.804738" in r.stdout  # 1/3 + 2/3 cos(2 pi / 8)
    r = invoke(["config", "--algo", "dsgd", "--set", "workers=6"])
    assert r.exit_code == 0 and "workers = 6" in r.stdout and 'name = "dsgd"' in r.stdout


@pytest.mark.parametrize("extra,needle", [
    (["--topology", "star"], "topology.name"),
    (["--data", "{d}/empty.bin"], "empty.bin"),
    (["--set", "model.n_head=3"], "n_head"),
])
def test_real_process_prints_one_line(files, tmp_path, extra, needle):
    """The installed entry point in a fresh interpreter: exit 2, one line, no traceback."""
    cmd = [sys.executable, "-m", "gasloc_emu", "simulate", *QUICK, "-H", "1",
           "--out", str(tmp_path / "run"), *[a.replace("{d}", str(files)) for a in extra]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines


def test_a_bad_command_line_is_answered_without_loading_torch():
    """A setting out of range is refused before the heavy imports: the one line comes in a
    fraction of a second, not after the second torch takes to load (the bad-input check
    looks only at the error classes of modules already loaded)."""
    probe = ("import sys\n"
             "sys.argv = ['gasloc-emu', 'run', '--workers', '0']\n"
             "from gasloc_emu.commands.entry import main\n"
             "try:\n"
             "    main()\n"
             "except SystemExit as exc:\n"
             "    print(exc.code, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr[-2000:])
    assert proc.stderr.strip().startswith("error: workers = 0"), proc.stderr
