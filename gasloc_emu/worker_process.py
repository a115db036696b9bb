"""The entry point of one emulator worker process: ``python -m gasloc_emu.worker_process DIR RANK``.

It reads the resolved config and its launch spec from the run directory, binds its data-plane
address, reports it, waits for the launcher's start (with every peer's address), trains, and
sends its metrics and final parameters over the control plane. It dies with the launcher
(PR_SET_PDEATHSIG) and stops when told to, when a peer is lost, or on any error, which it
reports before exiting non-zero.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the launcher dies, even by kill -9."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the heartbeat timeout still catches it
        return
    if os.getppid() == 1:  # the launcher died before prctl took effect
        os._exit(1)


class Heartbeat(threading.Thread):
    """Sends {round, step, state, peer} to the launcher every ``period_s`` from its own socket."""

    def __init__(self, ctx, addr: str, rank: int, period_s: float, probe):
        super().__init__(name="heartbeat", daemon=True)
        import zmq
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 4)
        self.sock.connect(addr)
        self.rank, self.period_s, self.probe = rank, period_s, probe
        self.halt = threading.Event()

    def run(self) -> None:
        import zmq
        from .transport.control import pack
        while not self.halt.wait(self.period_s):
            try:
                self.sock.send(pack({"type": "hb", "worker": self.rank} | self.probe()), zmq.NOBLOCK)
            except zmq.Again:
                pass  # the launcher is busy; the next beat carries the same news

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=2)
        self.sock.close()


def main(argv: list[str]) -> int:
    die_with_parent()
    run_dir, rank = Path(argv[0]), int(argv[1])
    spec = json.loads((run_dir / "launch.json").read_text())
    threads = spec["threads"]
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch
    torch.set_num_threads(threads)
    import zmq

    from .transport.control import WorkerControl
    ctx = zmq.Context()
    ctl = WorkerControl(ctx, spec["ctl"], rank)
    try:
        return _serve(run_dir, rank, spec, ctx, ctl)
    except BaseException as exc:  # noqa: BLE001 - report every failure to the launcher, then exit
        ctl.send({"type": "error", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        ctl.close()
        ctx.term()


def _serve(run_dir: Path, rank: int, spec: dict, ctx, ctl) -> int:
    from . import config
    from .simulate import build_corpus
    from .transport.zmq_transport import ZmqTransport
    from .worker import Worker

    state = {"round": -1, "step": 0, "phase": "starting", "transport": None}
    hb = Heartbeat(ctx, spec["hb"], rank, spec["heartbeat_s"], lambda: _status(state))
    hb.start()
    tp = None
    try:
        cfg = config.resolve(run_dir / "config.toml")
        device = spec["devices"][rank]
        corpus = build_corpus(cfg)
        from .model import count_parameters
        tp = ZmqTransport(rank, cfg.workers, spec["bind"][rank], ctx=ctx,
                          max_numel=count_parameters(cfg.model),
                          recv_timeout_s=spec["peer_timeout_s"],
                          should_stop=ctl.poll_stop, shaping=_shaping(spec, rank))
        state["transport"] = tp
        ctl.send({"type": "ready", "addr": tp.address, "device": device})
        start = ctl.wait_for("start", spec["start_timeout_s"])
        if start["type"] == "stop":
            return 0
        tp.connect({int(k): v for k, v in start["peers"].items()})
        worker = Worker(cfg, rank, tp, corpus, device)
        _train(cfg, worker, ctl, state, start["t0"])
        if ctl.stop_requested:
            return 0
        state["phase"] = "evaluating"
        ev = worker.evaluate()
        theta = worker.theta.detach().to("cpu")
        from .transport.control import tensor_frame
        ctl.send({"type": "final", "eval_loss": ev, "dtype": str(theta.dtype).split(".")[-1],
                  "numel": theta.numel(), "counters": tp.counters()}, tensor_frame(theta))
        state["phase"] = "done"
        ctl.wait_for("exit", spec["exit_timeout_s"])
        return 0
    finally:
        hb.stop()
        if tp is not None:
            tp.close()


def _train(cfg, worker, ctl, state: dict, t0: float) -> None:
    for t in range(cfg.run.rounds):
        if ctl.poll_stop():
            return
        state.update(round=t, phase="computing")
        stats = worker.run_round(t, on_compute_done=lambda s: state.update(phase="communicating"))
        state["step"] = worker.step
        if worker.should_eval(t):
            state["phase"] = "evaluating"
            stats.eval_loss = worker.evaluate()
        row = stats.as_dict() | {"time_s": time.time() - t0,
                                 "dropped": worker.transport.counters()["dropped"]}
        ctl.send({"type": "metric", "row": row})


def _status(state: dict) -> dict:
    tp = state["transport"]
    peer = tp.waiting_for if tp is not None else None
    phase = state["phase"]
    if phase == "communicating":
        phase = "waiting" if peer is not None else "sending"
    sent = dict(tp.bytes_sent) if tp is not None else {}  # cumulative, per peer: link meters
    return {"round": state["round"], "step": state["step"], "state": phase, "peer": peer,
            "sent": sent}


def _shaping(spec: dict, rank: int):
    """The userspace shaper for this worker, when the launcher chose one."""
    if not spec.get("shaping"):
        return None
    from netem.userspace import shaping_from_spec
    return shaping_from_spec(spec["shaping"], rank)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
