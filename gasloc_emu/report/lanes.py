"""What A2CiD2's two lanes did, read back from its metrics rows (one per gradient step; a slot's
exchanges on its last step's row, with ``step_span_s`` and ``exchange_spans_s``, see
``algorithms.a2cid2.Slots``): the communications per gradient step each worker made, and the
share of exchange time during which the same worker was computing (the record shows that the
lanes overlap). Pure: the launcher feeds it the rows it receives, the simulator the rows it
writes.
"""
from __future__ import annotations


def overlap_s(span: tuple[float, float], others: list[tuple[float, float]]) -> float:
    """Seconds of ``span`` that some interval of ``others`` covers (``others`` disjoint)."""
    a, b = span
    return sum(max(0.0, min(b, d) - max(a, c)) for c, d in others)


class LaneTally:
    """Per worker: gradient steps, exchanges made (with a partner), exchange seconds and the
    part of them spent while the worker's own step ran; fed one metrics row at a time."""

    def __init__(self, workers: int):
        self.steps = [0] * workers
        self.exchanges = [0] * workers
        self.exchange_s = [0.0] * workers
        self.overlapped_s = [0.0] * workers
        self._step_spans: list[list[tuple[float, float]]] = [[] for _ in range(workers)]

    def add(self, row: dict) -> None:
        """One step's row; its ``exchange_spans_s`` (if any) are the slot's, and the slot's
        step spans are this row's and the ones before it since the last exchange row."""
        w = row["worker"]
        self.steps[w] += 1
        self.exchanges[w] += len(row.get("peers", ()))
        if "step_span_s" in row:
            self._step_spans[w].append(tuple(row["step_span_s"]))
        if "exchange_spans_s" in row:   # the slot's last step
            for span in (tuple(s) for s in row["exchange_spans_s"]):
                self.exchange_s[w] += span[1] - span[0]
                self.overlapped_s[w] += overlap_s(span, self._step_spans[w])
            self._step_spans[w] = []

    def record(self) -> dict:
        """summary.json's measured part of the ``asynchronous`` block."""
        per_worker = [e / s if s else 0.0 for e, s in zip(self.exchanges, self.steps,
                                                                 strict=True)]
        total_x = sum(self.exchange_s)
        return {"comms_per_step": per_worker,
                "comms_per_step_mean": sum(self.exchanges) / max(1, sum(self.steps)),
                "exchange_s": round(total_x, 6),
                "overlap_share": sum(self.overlapped_s) / total_x if total_x > 0 else 0.0}


__all__ = ["LaneTally", "overlap_s"]
