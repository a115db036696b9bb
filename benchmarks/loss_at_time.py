"""Loss at equal wall time from a sweep's data file: each group's arms read at one time T.

    python benchmarks/loss_at_time.py docs/results/cloud-placement.jsonl [--at-s T]

For each group of the sweep (its arms' ``group``), T is the shortest reported run's clock (the
simulator's predicted clock in simulate mode) unless ``--at-s`` gives one; each reported run is
read at its last evaluation at or before T. The loss is the evaluated curve's (metrics.jsonl's
eval_loss: the mean over workers of each one's own model on the eval batches), not the final
eval of the average model that the results table gives. Mean ± sample standard deviation over
the reported seeds, and each arm's seconds per round (clock / rounds). Reads only the data file.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gasloc_emu.experiments import data, stats  # noqa: E402


def loss_at(curve: list, at_s: float) -> tuple[float | None, int | None]:
    """(eval loss, round) of the last evaluation at or before ``at_s``; (None, None) if none."""
    seen = [(t, loss, rnd) for rnd, t, loss in curve if t is not None and t <= at_s + 1e-9]
    if not seen:
        return None, None
    _, loss, rnd = max(seen)
    return loss, rnd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data_file")
    ap.add_argument("--at-s", type=float, default=None, help="read every group at this time")
    args = ap.parse_args()
    header, rows = data.read(args.data_file)
    arms = {a["name"]: a.get("group") or "all" for a in header["spec"]["arms"]}
    runs = [r for r in rows if r["phase"] == data.REPORT and r.get("status", "ok") == "ok"]
    print("| group | T (s) | arm | eval loss at T | last evaluated round by T | s per round |")
    print("| --- | --- | --- | --- | --- | --- |")
    for group in dict.fromkeys(arms.values()):
        mine = [r for r in runs if arms.get(r["arm"]) == group]
        if not mine:
            continue
        at_s = args.at_s if args.at_s is not None else min(r["clock_s"] for r in mine)
        for arm in [a for a, g in arms.items() if g == group]:
            its = [r for r in mine if r["arm"] == arm]
            read = [loss_at(r["curve"], at_s) for r in its]
            loss = stats.sample(v for v, _ in read)
            done = stats.sample(rnd for _, rnd in read)
            per_round = stats.sample(r["clock_s"] / r["rounds"] for r in its)
            sd = "-" if loss.sd is None else f"{loss.sd:.4f}"
            print(f"| {group} | {at_s:.1f} | {arm} | "
                  + ("-" if loss.mean is None else f"{loss.mean:.4f} ± {sd} (n={loss.n})")
                  + f" | {done.mean:.0f} | {per_round.mean:.3f} |")


if __name__ == "__main__":
    main()
