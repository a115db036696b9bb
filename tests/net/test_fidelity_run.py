"""A run that starves its own packet line says so: with one CPU hog per core and the line at
normal priority, summary.json's fidelity is degraded, naming the line's lateness (measured by
the line's own release clock against each frame's due time), and delay_faithful_to_tcp is no
longer true; under --require-faithful it ends with its own exit code."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from gasloc_emu import exitcodes

HOG_S = 60.0   # each hog ends by itself even if the finally below never runs


def _hogs() -> list[subprocess.Popen]:
    code = f"import time\nend = time.time() + {HOG_S}\nwhile time.time() < end: pass\n"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]


def test_a_starved_packet_line_makes_the_run_degraded(tc_caps, tmp_path):
    out = tmp_path / "run"
    hogs = _hogs()
    try:
        t0 = time.time()
        res = subprocess.run(
            [sys.executable, "-m", "gasloc_emu", "run", "--workers", "3", "--rounds", "4",
             "--local-steps", "2", "--model", "tiny", "--no-dashboard",
             "--set", "data.max_corpus_mb=1", "--bw-profile", "uniform", "--latency-ms", "10",
             "--set", "net.delay=packet-line", "--set", "net.line_priority=none",
             "--set", "compute.step_time_s=0.05", "--set", "net.probe=false",
             "--require-faithful", "--out", str(out)], capture_output=True, text=True, timeout=120)
        took_s = time.time() - t0
    finally:
        for p in hogs:
            p.kill()
        for p in hogs:
            p.wait()
    assert res.returncode == exitcodes.UNFAITHFUL, res.stderr
    said = [ln for ln in res.stderr.splitlines() if "run not faithful" in ln]
    assert len(said) == 1, res.stderr
    s = json.loads((out / "summary.json").read_text())
    # the line is one process, so its lateness is every link's: the error names whichever link
    # the verdict ranked worst, and it is the one summary.json records
    worst = s["fidelity"]["worst_link"]
    assert worst is not None and f"worst link {worst['src']}->{worst['dst']}" in said[0], said
    assert s["status"] == "degraded"
    assert s["fidelity"]["fidelity"] == "degraded", (s["fidelity"], took_s)
    rules = {r["rule"] for r in s["fidelity"]["reasons"]}
    assert rules & {"lateness", "read_lag"}, s["fidelity"]
    assert s["delay_faithful_to_tcp"] is False and s["delay_faithful_measured"] is False
