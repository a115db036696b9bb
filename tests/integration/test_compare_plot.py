"""Two real (short) simulator runs, read back, compared in a table and plotted to a PNG."""
from __future__ import annotations

import io

import matplotlib  # noqa: F401  (the test extra has it: missing is an error, not a skip)
import pytest
from rich.console import Console

from gasloc_emu.config import resolve
from gasloc_emu.plan import build_plan
from gasloc_emu.report.compare import compare_table, load_run, plot, show_run
from gasloc_emu.simulator.simulate import simulate

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("runs")
    out = []
    for algo, topo in (("gasloc", "ring"), ("diloco", "ring")):
        cfg = resolve(overrides={"algo.name": algo, "topology.name": topo, "workers": 4,
                                 "model.preset": "tiny", "algo.local_steps": 4,
                                 "run.rounds": 3, "run.eval_every": 1, "run.dashboard": "off",
                                 "data.eval_batches": 2, "data.max_corpus_mb": 1.0})
        path = base / f"{algo}-{topo}"
        simulate(build_plan(cfg), path)
        out.append(path)
    return out


def test_plot_writes_a_png_with_both_panels(run_dirs, tmp_path):
    runs = [load_run(d) for d in run_dirs]
    assert all(r.warnings == [] for r in runs)
    png = tmp_path / "compare.png"
    fig = plot(runs, png)
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    by_round, by_time = fig.axes
    assert by_round.get_xlabel() == "round" and by_time.get_xlabel().startswith("seconds")
    # per run: an eval line and a train line in each panel
    assert len(by_round.get_lines()) == 4 and len(by_time.get_lines()) == 4
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["gasloc-ring (gasloc/ring)", "diloco-ring (diloco/ring-allreduce)"]


def test_the_table_and_run_view_read_real_records(run_dirs):
    runs = [load_run(d) for d in run_dirs]
    console = Console(record=True, width=160, color_system=None, file=io.StringIO())
    console.print(compare_table(runs, target_loss=10.0))
    console.print(show_run(runs[0]))
    text = console.export_text()
    assert "gasloc-ring" in text and "diloco-ring" in text and "not reached" not in text
    assert "final_eval_loss" in text and "rounds recorded        3" in text
