"""Control plane between the launcher and its workers: ipc:// sockets in the run directory.

A Unix socket path reaches across network namespaces and is never shaped, so control traffic
(start, stop, heartbeats, metrics, final parameters) never competes with the emulated links.

    launcher ROUTER  <-  worker DEALER (identity b"w<rank>"): ready, metric, final, error; start, stop, exit
    launcher PULL    <-  worker PUSH (heartbeat thread): hb {worker, round, step, state, peer}

Every message is msgpack; final parameters travel as one extra raw frame. No pickle.
"""
from __future__ import annotations

import os
from pathlib import Path

import msgpack
import torch
import zmq


def ctl_paths(run_dir: str | os.PathLike) -> tuple[str, str]:
    """(control endpoint, heartbeat endpoint) for a run directory.

    Unix socket paths are limited to about 107 bytes, so long run directories get a short
    symlink-free path under the system's temp folder instead.
    """
    base = Path(run_dir).resolve()
    if len(str(base)) > 80:
        base = Path("/tmp") / f"gasloc-{os.getpid()}-{abs(hash(str(base))) % 10**8}"
        base.mkdir(parents=True, exist_ok=True)
    return f"ipc://{base}/ctl.sock", f"ipc://{base}/hb.sock"


def pack(msg: dict) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def unpack(raw: bytes) -> dict:
    """A control message, or a dict with type 'invalid' (never raises on bad bytes)."""
    try:
        msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError):
        return {"type": "invalid"}
    return msg if isinstance(msg, dict) and isinstance(msg.get("type"), str) else {"type": "invalid"}


def tensor_frame(t: torch.Tensor) -> memoryview:
    """A zero-copy view of a contiguous CPU tensor's bytes."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    return memoryview(t.view(torch.uint8).numpy())  # via bytes: numpy has no bfloat16


def frame_tensor(frame: zmq.Frame | bytes, dtype: str, numel: int) -> torch.Tensor:
    buf = frame.buffer if isinstance(frame, zmq.Frame) else frame
    arr = torch.frombuffer(bytearray(buf), dtype=getattr(torch, dtype))
    if arr.numel() != numel:
        raise ValueError(f"final parameters hold {arr.numel()} values; expected {numel}")
    return arr


class WorkerControl:
    """The worker's end: a DEALER for requests and replies, a PUSH for heartbeats."""

    def __init__(self, ctx: zmq.Context, ctl_addr: str, rank: int):
        self.rank = rank
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"w{rank}".encode())
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.connect(ctl_addr)
        self.stop_requested = False

    def send(self, msg: dict, *frames) -> None:
        self.sock.send_multipart([pack(msg | {"worker": self.rank}), *frames], copy=False)

    def wait_for(self, kind: str, timeout_s: float) -> dict:
        """Block until a message of ``kind`` (or stop) arrives."""
        if self.sock.poll(int(timeout_s * 1000)):
            msg = unpack(self.sock.recv())
            if msg["type"] == "stop":
                self.stop_requested = True
            if msg["type"] in (kind, "stop"):
                return msg
            return self.wait_for(kind, timeout_s)
        raise TimeoutError(f"worker {self.rank}: no {kind!r} from the launcher in {timeout_s:.0f} s")

    def poll_stop(self) -> bool:
        """True once the launcher asked this worker to stop (non-blocking)."""
        while not self.stop_requested and self.sock.poll(0):
            if unpack(self.sock.recv())["type"] in ("stop", "exit"):
                self.stop_requested = True
        return self.stop_requested

    def close(self) -> None:
        self.sock.close()
