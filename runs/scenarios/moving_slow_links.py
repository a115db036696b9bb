"""Write moving-slow-links.csv: a link trace whose slow links move every 6 seconds.

    python runs/scenarios/moving_slow_links.py      # rewrites runs/scenarios/moving-slow-links.csv

8 workers; in each 6-second phase (0, 6, ..., 54 s) three random pairs of workers (seeded, both
directions) run at 2 Mbit/s and every other link at 50 Mbit/s: the skewed profile's shape, with
its slow pairs moving. Every directed link has a row in every phase, so each phase stands alone.
"""
from __future__ import annotations

import itertools
import random
from pathlib import Path

WORKERS, PHASE_S, PHASES, SLOW_PAIRS = 8, 6.0, 10, 3
FAST_MBIT, SLOW_MBIT, SEED = 50.0, 2.0, 0


def rows() -> list[str]:
    rng = random.Random(SEED)
    pairs = list(itertools.combinations(range(WORKERS), 2))
    out = ["time_s,src,dst,rate_mbit"]
    for k in range(PHASES):
        slow = set(rng.sample(pairs, SLOW_PAIRS))
        for src, dst in itertools.permutations(range(WORKERS), 2):
            rate = SLOW_MBIT if (min(src, dst), max(src, dst)) in slow else FAST_MBIT
            out.append(f"{k * PHASE_S:g},{src},{dst},{rate:g}")
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("moving-slow-links.csv")
    path.write_text("\n".join(rows()) + "\n")
    print(f"wrote {path} ({len(rows()) - 1} rows)")
