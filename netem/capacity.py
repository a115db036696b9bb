"""How many frames a second the packet line moves on this host: what ``run.time_scale =
'auto'`` fits a plan's peak frame rate into (``gasloc_emu.netplan``, "Time dilation").

    python -m netem.capacity            # measure now (in a throwaway namespace), print JSON

The measurement goes through the packet line's public entry point (``python -m
netem.packetline SPEC.json``, a ``PacketLineSpec``), so it measures whichever engine is
there. In a throwaway ``unshare -Urn`` namespace (nothing of the host's network is touched;
no address outside 198.18.0.0/15): two veth pairs w0-p0 and w1-p1, the line over p0 and p1
with links of no delay, and a burst of 1500-byte UDP/IPv4 frames (MTU-size: more per-frame
work than the 64-byte frames of a pps benchmark) written on w0 with a raw packet socket for
``duration_s``. The line's rate is what w1 received (its rx_packets counter, the kernel's, not
the line's own count) over that time. When the line kept up with the sender, that is the
sender's rate, and the capacity is at least that: a lower bound, said in ``bound``.

A 64 KiB GSO frame costs the line more than one MTU frame (a larger copy); a plan's frames
are counted at their number, not their size, so a line fast on small frames and slow on large
ones is over-estimated: the 50 % margin of 'auto' is there for that too.

Cached per host (``~/.cache/gasloc-emu/packetline-capacity.json``, ``$XDG_CACHE_HOME`` if set)
with the date, the machine (host name, CPU model, cores, kernel) and the engine (the packet
line module's digest): a measurement costs about a second and two namespaces' setup, and a
run that starts often should not pay it each time. It is taken again when the machine or the
engine changed, or after ``MAX_AGE_S``.
"""
from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import platform
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CACHE_VERSION = 1
MAX_AGE_S = 7 * 86_400.0
DURATION_S = 0.5              # the burst
MAX_FRAMES = 2_000_000        # the burst's bound in frames, whatever the sender's speed
FRAME_BYTES = 1500            # on the wire, Ethernet header included
READY_TIMEOUT_S = 20.0        # the line opening its ports
OUTER_TIMEOUT_S = 60.0        # the whole measurement, namespace setup included
ADDRS = ("198.18.0.1", "198.18.0.2")


class CapacityError(RuntimeError):
    """The packet line's capacity cannot be measured here (no namespaces, no line)."""


@dataclass(frozen=True)
class Capacity:
    """``frames_per_s`` the line moved; ``bound``: 'measured' (the line fell behind the
    sender) or 'at least' (it kept up: the sender's rate); ``source``: where the number
    comes from (measured now, or the cache, with its date and machine)."""

    frames_per_s: float
    bound: str
    source: str


# ---------------------------------------------------------------- the cache (pure)

def machine() -> dict:
    """What the number is a property of: this host's name, CPU model, cores and kernel."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"host": socket.gethostname(), "cpu": model, "cores": os.cpu_count() or 0,
            "kernel": platform.release()}


def engine() -> str:
    """The packet line's identity: the digest of its entry point's module (a rewritten
    engine is measured again)."""
    import netem.packetline as pl
    return hashlib.sha256(Path(pl.__file__).read_bytes()).hexdigest()[:16]


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gasloc-emu" / "packetline-capacity.json"


def read_cache(path: Path, now_s: float, here: dict, eng: str) -> Capacity | None:
    """The cached capacity if it is this machine's and engine's and younger than MAX_AGE_S;
    None otherwise (absent, unreadable, stale: measured again)."""
    try:
        d = json.loads(path.read_text())
        ok = d["version"] == CACHE_VERSION and d["machine"] == here and d["engine"] == eng \
            and 0 <= now_s - float(d["measured_at_s"]) <= MAX_AGE_S \
            and float(d["frames_per_s"]) > 0 and d["bound"] in ("measured", "at least")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not ok:
        return None
    when = datetime.datetime.fromtimestamp(float(d["measured_at_s"]), datetime.timezone.utc)
    return Capacity(float(d["frames_per_s"]), d["bound"],
                    f"cached {path} (measured {when:%Y-%m-%d %H:%M} UTC on {here['host']})")


def write_cache(path: Path, cap: Capacity, now_s: float, here: dict, eng: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": CACHE_VERSION, "frames_per_s": cap.frames_per_s,
                               "bound": cap.bound, "measured_at_s": now_s, "machine": here,
                               "engine": eng}, indent=2))
    os.replace(tmp, path)


def host_capacity(measure_fn: Callable[[], Capacity] | None = None,
                  path: Path | None = None, clock: Callable[[], float] = time.time
                  ) -> Capacity:
    """This host's capacity: the cache's where valid, else measured now (``measure_fn``,
    default ``measure``) and cached. CapacityError where it cannot be measured."""
    path = cache_path() if path is None else path
    here, eng, now_s = machine(), engine(), clock()
    cached = read_cache(path, now_s, here, eng)
    if cached is not None:
        return cached
    cap = (measure_fn or measure)()
    try:
        write_cache(path, cap, now_s, here, eng)
    except OSError as exc:   # the number stands; the next run measures again, and says so
        print(f"netem.capacity: not cached ({path}: {exc.strerror})", file=sys.stderr)
    return cap


# ---------------------------------------------------------------- the measurement

def measure(duration_s: float = DURATION_S) -> Capacity:
    """Measure now, in a throwaway user and network namespace (``unshare -Urn``)."""
    if not 0.05 <= duration_s <= 5.0:
        raise CapacityError(f"duration_s = {duration_s!r} is out of range; expected a "
                            "number in [0.05, 5]")
    cmd = ["unshare", "-Urn", sys.executable, "-m", "netem.capacity", "--inside",
           repr(duration_s)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=OUTER_TIMEOUT_S,
                             check=False)
    except FileNotFoundError:
        raise CapacityError("no unshare(1) on this host to make a namespace") from None
    except subprocess.TimeoutExpired:
        raise CapacityError(f"the measurement took over {OUTER_TIMEOUT_S:g} s") from None
    last = out.stdout.strip().splitlines()[-1:] if out.stdout.strip() else []
    if out.returncode != 0 or not last:
        why = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise CapacityError(f"no namespace or no packet line here ({why})")
    d = json.loads(last[0])
    when = datetime.datetime.now(datetime.timezone.utc)
    return Capacity(float(d["frames_per_s"]), d["bound"],
                    f"measured {when:%Y-%m-%d %H:%M} UTC on {socket.gethostname()} "
                    f"({d['sent']} frames offered, {d['received']} through in "
                    f"{d['elapsed_s']:.2f} s)")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _link(dev: str) -> dict:
    """``ip -j -s link show`` of ``dev`` (the namespace's own: /sys would show the mount's)."""
    out = subprocess.run(["ip", "-j", "-s", "link", "show", "dev", dev], check=True,
                         capture_output=True, text=True, timeout=10)
    return json.loads(out.stdout)[0]


def _mac(dev: str) -> bytes:
    return bytes.fromhex(_link(dev)["address"].replace(":", ""))


def _rx(dev: str) -> int:
    """Frames the kernel delivered to ``dev`` (its rx counter)."""
    return int(_link(dev)["stats64"]["rx"]["packets"])


def _frame(src_mac: bytes, dst_mac: bytes) -> bytes:
    """One UDP/IPv4 frame of FRAME_BYTES from ADDRS[0] to ADDRS[1] (checksummed header: the
    line drops a malformed one)."""
    ip_len = FRAME_BYTES - 14
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, ip_len, 0, 0x4000, 64, 17, 0,
                      socket.inet_aton(ADDRS[0]), socket.inet_aton(ADDRS[1]))
    total = sum(struct.unpack("!10H", hdr))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    hdr = hdr[:10] + struct.pack("!H", ~total & 0xFFFF) + hdr[12:]
    udp = struct.pack("!HHHH", 9, 9, ip_len - 20, 0) + bytes(ip_len - 28)
    return dst_mac + src_mac + b"\x08\x00" + hdr + udp


def _inside(duration_s: float) -> dict:
    """In the throwaway namespace: the veths, the line, the burst; the counts."""
    from netem.packetline import PacketLineSpec, Port
    for k in (0, 1):
        _ip("link", "add", f"w{k}", "type", "veth", "peer", "name", f"p{k}")
        for dev in (f"w{k}", f"p{k}"):
            _ip("link", "set", dev, "up")
    with tempfile.TemporaryDirectory(prefix="gasloc-capacity-") as tmp:
        ready = os.path.join(tmp, "ready.json")
        spec = PacketLineSpec(ports=(Port(0, "p0", ADDRS[0]), Port(1, "p1", ADDRS[1])),
                              ready_path=ready)
        spec.save(os.path.join(tmp, "spec.json"))
        line = subprocess.Popen([sys.executable, "-m", "netem.packetline",
                                 os.path.join(tmp, "spec.json")], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not os.path.exists(ready):
                if line.poll() is not None or time.monotonic() > deadline:
                    raise CapacityError("the packet line did not open its ports")
                time.sleep(0.02)
            return _burst(duration_s)
        finally:
            line.stdin.close()   # EOF: the line exits
            try:
                line.wait(timeout=5)
            except subprocess.TimeoutExpired:
                line.kill()
                line.wait()


def _burst(duration_s: float) -> dict:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    sock.bind(("w0", 0))
    frame = _frame(_mac("w0"), _mac("w1"))
    rx0, sent = _rx("w1"), 0
    t0 = time.perf_counter()
    end = t0 + duration_s
    send = sock.send
    while sent < MAX_FRAMES:
        for _ in range(256):   # the clock read once per 256 frames
            # a full queue (ENOBUFS, EAGAIN) refuses the frame: not offered, not counted
            with contextlib.suppress(OSError):
                send(frame)
                sent += 1
        if time.perf_counter() >= end:
            break
    elapsed = time.perf_counter() - t0
    received = _rx("w1") - rx0
    sock.close()
    # the line kept up (within 5 %): what came through is the sender's rate, a lower bound
    bound = "at least" if received >= 0.95 * sent else "measured"
    return {"frames_per_s": received / elapsed, "bound": bound, "sent": sent,
            "received": received, "elapsed_s": elapsed}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--inside"]:
        try:
            print(json.dumps(_inside(float(argv[1]))), flush=True)
        except (CapacityError, OSError, subprocess.SubprocessError) as exc:
            print(f"netem.capacity: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        cap = measure()
    except CapacityError as exc:
        print(f"netem.capacity: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(cap.__dict__))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
