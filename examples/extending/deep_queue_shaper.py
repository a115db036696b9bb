"""A shaper in one file: the userspace shaper with a deep send queue on every link.

Register it under the entry-point group ``gasloc_emu.shapers`` in your package's
pyproject.toml, then run with ``--shaper deep-queue`` (or name it by path:
``--shaper deep_queue_shaper:DeepQueue``, with this file's folder importable)::

    [project.entry-points."gasloc_emu.shapers"]
    deep-queue = "deep_queue_shaper:DeepQueue"

The userspace shaper makes a sender wait while one of its links holds more than half a second
of data (``netem.userspace.MAX_QUEUE_S``), as a NIC's queue would. On a slow link a round's
messages hold many seconds of data; this one lets a sender hand up to ``DEEP_QUEUE_S`` of it to
a link before it waits, as a deep bottleneck buffer would take it. Rates and latencies are the
userspace shaper's, so ``simulate`` predicts it as it predicts that one; the receivers accept
release times that far ahead, since every worker builds its pacer from the same spec.
"""
from __future__ import annotations

from netem.shaper_userspace import UserspaceShaper
from netem.userspace import build_spec

DEEP_QUEUE_S = 8.0


class DeepQueue(UserspaceShaper):
    name = "deep-queue"
    where = f"sender pacing with a {DEEP_QUEUE_S:g} s queue per link + receiver release queue"

    def worker_spec(self, plan, decision) -> dict | None:
        return build_spec(plan, "userspace", max_queue_s=DEEP_QUEUE_S)
