"""Bad network input: one clear line, exit 2, and nothing created."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=120)


def netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.fixture
def profile_file(tmp_path):
    def write(text: str) -> str:
        path = tmp_path / "profile.toml"
        path.write_text(text)
        return str(path)
    return write


@pytest.mark.parametrize("extra, needle", [
    (["--bw-profile", "bogus"], "bogus"),
    (["--bw-profile", "uniform", "--rate-mbit", "-5"], "rate_mbit"),
    (["--bw-profile", "uniform", "--rate-mbit", "0"], "rate_mbit"),
    (["--bw-profile", "uniform", "--latency-ms", "20000"], "latency_ms"),
    (["--bw-profile", "skewed", "--set", "net.slow_rate_mbit=-1"], "slow_rate_mbit"),
])
def test_bad_profiles_fail_before_anything_exists(tmp_path, extra, needle):
    before = netns()
    out = tmp_path / "run"
    res = run_cli("run", "--workers", "4", "--model", "tiny", "--out", str(out), *extra)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists() and netns() == before


def test_profile_file_naming_a_missing_worker(tmp_path, profile_file):
    path = profile_file("[default]\nrate_mbit = 50\n[[link]]\nsrc = 0\ndst = 7\nrate_mbit = 5\n")
    res = run_cli("run", "--workers", "4", "--model", "tiny", "--bw-profile", path,
                  "--out", str(tmp_path / "run"))
    assert res.returncode == 2 and "7" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_profile_file_with_an_unknown_key(tmp_path, profile_file):
    path = profile_file("[default]\nrate_mbit = 50\nbandwidth = 3\n")
    res = run_cli("netem", "show", "--workers", "4", "--bw-profile", path)
    assert res.returncode == 2 and "bandwidth" in res.stderr and "Traceback" not in res.stderr


def test_netem_show_prints_every_link_of_a_file_profile(profile_file):
    path = profile_file("[default]\nrate_mbit = 50\nlatency_ms = 2\n"
                        "[[link]]\nsrc = 0\ndst = 3\nrate_mbit = 5\n"
                        "[[worker]]\nid = 2\nup_mbit = 20\ndown_mbit = 20\n")
    res = run_cli("netem", "show", "--workers", "4", "--bw-profile", path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("→") == 12  # every directed link of 4 workers
    assert "worker 2: up 20" in res.stdout
