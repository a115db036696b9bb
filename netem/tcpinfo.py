"""What held a TCP sender back, as its kernel timed it: TCP_INFO's chrono counters.

Linux (4.10 and later) times every connection's sending in three states: busy (it had data queued,
sent or unacknowledged, and sent as cwnd and pacing allowed), limited by the receiver's window,
and limited by its own send buffer. Time in none of them is time the application left it
nothing to send. The probe reads them at both ends of its measurement window, so that a link
that reads below its rate says who held it back: its sender (idle time: the process did not
write), its receiver (window-limited time: the process did not read), or the path (busy all the
window, and still short: the qdisc or the kernel delivered less than the rate).

Offsets are those of ``struct tcp_info`` in include/uapi/linux/tcp.h; the counters are in
microseconds, counted in jiffies (a few ms each), so a window of a second or more is needed.
"""
from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

_INFO_BYTES = 232                 # enough for every field read here
_TOTAL_RETRANS = struct.Struct("=I")
_TOTAL_RETRANS_AT = 100           # tcpi_total_retrans
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_AT = 120             # tcpi_bytes_acked (4.1 and later)
_CHRONO = struct.Struct("=QQQ")   # tcpi_busy_time, tcpi_rwnd_limited, tcpi_sndbuf_limited (us)
_CHRONO_AT = 168


@dataclass(frozen=True)
class Chrono:
    """One reading of a connection's sending states (cumulative since it opened)."""

    at_s: float              # time.monotonic() of the reading
    busy_us: int             # time with data queued, the two limited states included
    rwnd_limited_us: int     # of that, held back by the receiver's window
    sndbuf_limited_us: int   # of that, held back by the send buffer
    total_retrans: int       # segments retransmitted
    bytes_acked: int = 0     # bytes the receiver's kernel has acknowledged


def read(sock: socket.socket) -> Chrono | None:
    """The connection's counters now; None where the kernel has no such fields (not Linux, or
    a kernel before 4.10)."""
    tcp_info = getattr(socket, "TCP_INFO", None)
    if tcp_info is None:
        return None
    raw = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, _INFO_BYTES)
    if len(raw) < _CHRONO_AT + _CHRONO.size:
        return None
    busy, rwnd, sndbuf = _CHRONO.unpack_from(raw, _CHRONO_AT)
    (retrans,) = _TOTAL_RETRANS.unpack_from(raw, _TOTAL_RETRANS_AT)
    (acked,) = _BYTES_ACKED.unpack_from(raw, _BYTES_ACKED_AT)
    return Chrono(time.monotonic(), busy, rwnd, sndbuf, retrans, acked)


def shares(first: Chrono | None, last: Chrono | None) -> dict | None:
    """How the time between two readings divides: ``sending`` (data queued, not limited by
    either buffer), ``rwnd_limited``, ``sndbuf_limited`` and ``idle`` (nothing queued: the
    application wrote too little), each a share of the interval; the retransmits in it; and
    ``acked_mbit``, the rate at which the receiver's kernel acknowledged bytes: the link's
    goodput timed by the sender's kernel, which a busy receiver process cannot skew."""
    if first is None or last is None or last.at_s <= first.at_s:
        return None
    window_us = (last.at_s - first.at_s) * 1e6
    busy = last.busy_us - first.busy_us
    rwnd = last.rwnd_limited_us - first.rwnd_limited_us
    sndbuf = last.sndbuf_limited_us - first.sndbuf_limited_us
    return {"sending": round((busy - rwnd - sndbuf) / window_us, 4),
            "rwnd_limited": round(rwnd / window_us, 4),
            "sndbuf_limited": round(sndbuf / window_us, 4),
            "idle": round(max(0.0, window_us - busy) / window_us, 4),
            "retransmits": last.total_retrans - first.total_retrans,
            "acked_mbit": round((last.bytes_acked - first.bytes_acked) * 8 / window_us, 4)}


# struct tcp_info fields a path measurement reports (offsets in include/uapi/linux/tcp.h)
_PATH_FIELDS = (("snd_mss", 16, "I"), ("rtt_us", 68, "I"), ("rttvar_us", 72, "I"),
                ("snd_cwnd", 80, "I"), ("total_retrans", 100, "I"), ("bytes_acked", 120, "Q"),
                ("segs_out", 136, "I"), ("min_rtt_us", 148, "I"), ("data_segs_out", 156, "I"),
                ("delivery_rate_bps", 160, "Q"), ("bytes_retrans", 208, "Q"))
_PATH_BYTES = 216


def path(sock: socket.socket) -> dict | None:
    """A connection's own account of its path: smoothed and minimum RTT, retransmits, segments
    and bytes sent, the kernel's last delivery-rate estimate; None where the kernel has no such
    fields (not Linux, or before 4.19, which added tcpi_bytes_retrans)."""
    tcp_info = getattr(socket, "TCP_INFO", None)
    if tcp_info is None:
        return None
    raw = sock.getsockopt(socket.IPPROTO_TCP, tcp_info, _PATH_BYTES + 8)
    if len(raw) < _PATH_BYTES:
        return None
    return {name: struct.unpack_from("=" + fmt, raw, at)[0] for name, at, fmt in _PATH_FIELDS}
