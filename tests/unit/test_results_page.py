"""docs/RESULTS.md is what its data files give: each section, rebuilt from its data file alone
(docs/results/<name>.jsonl), is the section's text to the byte, and every section has one."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gasloc_emu.experiments import crossover, data
from gasloc_emu.experiments.page import markdown_section
from gasloc_emu.experiments.sweep import build_report

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "RESULTS.md"


def sections() -> dict[str, str]:
    text = PAGE.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(
        r"<!-- begin (\S+) -->\n(.*?)\n<!-- end \1 -->", text, flags=re.S)}


def test_the_page_has_sections():
    assert len(sections()) >= 11


@pytest.mark.parametrize("name", sorted(sections()))
def test_a_section_is_its_data_file_rebuilt(name):
    body = sections()[name]
    path = REPO / "docs" / "results" / f"{name}.jsonl"
    assert path.exists(), f"{name}: no data file (docs/results/{name}.jsonl)"
    if '"kind": "crossover"' in path.read_text().split("\n", 1)[0]:
        assert crossover.section(*data.read(path, kind=crossover.KIND)) == body
        return
    header, rows = data.read(path)
    report = build_report(header, rows, None)
    assert markdown_section(name, report, report["command"], f"results/{name}.png") == body
