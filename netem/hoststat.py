"""What else the machine did while links were measured: its CPU time by kind (/proc/stat).

A virtual machine's vCPU can be descheduled by its hypervisor ("steal" time). HTB sends only
when a timer or softirq on some CPU dequeues it, and its bucket holds 1 ms of the rate, so a
stolen vCPU makes every fast link fall behind together (docs/NETWORK.md, "Known problems").
The probe records the steal share of its window so that a warning can name the cause.
"""
from __future__ import annotations

CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
STAT_PATH = "/proc/stat"
STEAL_NOTABLE = 0.05   # steal above this share of the CPU time is named in the probe's warnings


def cpu_times(path: str = STAT_PATH) -> dict[str, int] | None:
    """The machine's CPU time by kind so far (clock ticks); None where there is no /proc/stat."""
    try:
        with open(path) as f:
            values = f.readline().split()[1:1 + len(CPU_FIELDS)]
    except OSError:
        return None
    if len(values) < len(CPU_FIELDS):
        return None
    return dict(zip(CPU_FIELDS, map(int, values), strict=True))


def cpu_shares(before: dict | None, after: dict | None) -> dict[str, float] | None:
    """Each kind's share of the CPU time between two ``cpu_times`` (None if either is)."""
    if before is None or after is None:
        return None
    delta = {k: after[k] - before[k] for k in CPU_FIELDS}
    total = sum(delta.values()) or 1
    return {k: round(v / total, 4) for k, v in delta.items()}
