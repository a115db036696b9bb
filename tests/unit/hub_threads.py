"""One thread per worker of an in-memory hub, for tests of what workers do together."""
from __future__ import annotations

import threading
from collections.abc import Callable

from gasloc_emu.simulator.memory import Hub


def on_threads(n: int, body: Callable, dead: frozenset = frozenset()) -> dict:
    """``body(rank, transport)`` on one thread per worker of an ``n``-worker hub, each holding
    the simulator's turn lock (one computes at a time); {rank: what it returned}. A failure on
    any thread stops the others and is raised here. ``dead``: (dst, src, round, kind) of the
    messages lost with their sender's host (the hub raises ``PeerLost`` for them)."""
    hub, out = Hub(n, timeout_s=20.0, dead=dead), {}

    def run(rank: int) -> None:
        tp = hub.transport(rank)
        try:
            with hub.cond:
                out[rank] = body(rank, tp)
                tp.finish()
        except BaseException as exc:  # noqa: BLE001 - stop the other threads too
            hub.abort(exc)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60.0)
    if hub.error is not None:
        raise hub.error
    return out
