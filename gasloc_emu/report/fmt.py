"""Number formatting shared by the dashboard and the run tables: '-' for anything not a number."""
from __future__ import annotations

import math

from netem.hoststat import STEAL_NOTABLE


def finite(v) -> bool:
    """A real, finite number (bools and None are not)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _scaled(v, units: tuple[tuple[float, str], ...], spec: str, plain: str) -> str:
    if not finite(v):
        return "-"
    for div, unit in units:
        if abs(v) >= div:
            return f"{format(v / div, spec)}{unit}"
    return format(v, plain)


def nbytes(n) -> str:
    """1234567 -> '1.23 MB'."""
    out = _scaled(n, ((1e9, " GB"), (1e6, " MB"), (1e3, " kB")), ".2f", ".0f")
    return out if out == "-" or out[-1] == "B" else out + " B"


def count(v) -> str:
    """12345 -> '12.3k'."""
    return _scaled(v, ((1e9, "G"), (1e6, "M"), (1e3, "k")), ".1f", ".0f")


def link(src, dst, regions=()) -> str:
    """A directed link as tables show it: ``0→3``, or with the workers' regions (a placement's,
    ``net.placement``) ``0 aws:us-east-1 → 3 gcp:asia-east1``; a worker beyond ``regions``
    (or one not a number) goes without."""
    def end(w) -> str:
        known = isinstance(w, int) and not isinstance(w, bool) and 0 <= w < len(regions)
        return f"{w} {regions[w]}" if known else str(w)
    if not regions:
        return f"{src}→{dst}"
    return f"{end(src)} → {end(dst)}"


def mbit(v) -> str:
    return f"{v:.1f} Mbit/s" if finite(v) else "-"


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}" if math.isfinite(v) else "-"
    return "-" if v is None else str(v)


def summary_lines(summary: dict, record_path) -> list[str]:
    """The lines a finished run ends with: its headline numbers, where its record is, and a
    warning when inner steps overran their nominal time (the timing is then the host's)."""
    predicted = summary.get("predicted_wall_s")
    corpus = summary.get("corpus") or {}
    # a prepared corpus's perplexity is per subword token, the number language models report
    ppl = summary.get("final_perplexity") if corpus.get("prepared") else None
    return [f"final eval loss {_num(summary.get('final_eval_loss'))}  "
            + (f"perplexity {_num(ppl)}  " if ppl is not None else "") +
            f"consensus {_num(summary.get('consensus_distance'))}  "
            f"wall {_num(summary.get('wall_s'))}s"
            + (f"  predicted wall {_num(predicted)}s" if predicted is not None else ""),
            f"run record: {record_path}"] + _fault_lines(summary.get("membership")) \
        + _overrun_lines(summary.get("compute")) + _steal_lines(summary.get("host_cpu"))


def _fault_lines(membership) -> list[str]:
    """How many random faults were drawn and played, and why the others were not (the
    scenario's [faults] section; each one is in faults.json)."""
    counts = membership.get("faults") if isinstance(membership, dict) else None
    if not isinstance(counts, dict):
        return []
    by_outcome: dict[str, int] = {}
    for outcomes in counts.values():
        for outcome, n in outcomes.items():
            by_outcome[outcome] = by_outcome.get(outcome, 0) + n
    played = by_outcome.pop("played", 0)
    drawn = played + sum(by_outcome.values())
    rest = ", ".join(f"{reason} {n}" for reason, n in sorted(by_outcome.items()))
    return [f"random faults: {drawn} drawn, {played} played"
            + (f"; not played: {rest}" if rest else "") + " (faults.json)"]


def stolen(steal) -> str | None:
    """"the hypervisor took N% of this host's CPU time" when a steal share (of /proc/stat's CPU
    time, ``netem.hoststat``) is notable, else None."""
    if not finite(steal) or steal < STEAL_NOTABLE:
        return None
    return f"the hypervisor took {steal:.0%} of this host's CPU time"


def _steal_lines(shares) -> list[str]:
    """One warning line when the hypervisor took a notable share of the host's CPU time during
    the run (``host_cpu`` of summary.json): shaped links then fall behind their rates."""
    phrase = stolen(shares.get("steal") if isinstance(shares, dict) else None)
    if phrase is None:
        return []
    return [f"warning: {phrase} during the run; shaped links and step times may have run slow "
            "(docs/NETWORK.md, \"Known problems\")"]


def _overrun_lines(block) -> list[str]:
    """One warning line when any worker overran (``compute.overruns`` of summary.json)."""
    per_worker = block.get("overruns") if isinstance(block, dict) else None
    if not isinstance(per_worker, list) or not any(finite(n) and n > 0 for n in per_worker):
        return []
    worst = max(range(len(per_worker)), key=lambda k: per_worker[k] or 0)
    return [f"warning: {int(sum(n for n in per_worker if finite(n)))} inner steps took longer "
            f"than their nominal time (most on worker {worst}: {per_worker[worst]}); "
            "see overruns in metrics.jsonl"]
