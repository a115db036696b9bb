"""What the launcher accepts from its control plane, as pure checks (nothing from the wire is
trusted): a heartbeat parsed through ``transport.control``'s allow-list and sent by the worker
its connection authenticated as; a ROUTER message from a known worker's socket, authenticated
as that worker. Each check returns what it accepts or the reason to drop, counted by reason in
summary.json's ``control_drops``.
"""
from __future__ import annotations

from gasloc_emu.transport import auth, control
from gasloc_emu.transport.orders import Pair


def checked_heartbeat(msg: dict, sender: str, expect: control.Expect
                      ) -> control.Heartbeat | str:
    """The heartbeat, or why it is dropped; ``sender``: the user id its connection was
    authenticated as (``auth.peer_user`` of the frame), "" where the caller has none."""
    try:
        hb = control.parse(msg, expect)
    except control.ControlError as exc:
        return exc.reason
    if not isinstance(hb, control.Heartbeat):
        return "channel"  # replies belong on the ROUTER
    if sender and sender != auth.user_id(hb.worker):
        return "spoofed"
    return hb


def envelope_refusal(frames, rank: int | None) -> str | None:
    """Why a ROUTER message cannot be from worker ``rank`` (the worker whose DEALER identity
    its first frame is; None when no worker's), or None when it can: the body's User-Id must be
    that worker's (none on unauthenticated connections)."""
    if rank is None:
        return "sender"
    if len(frames) < 2:
        return "frames"
    user = auth.peer_user(frames[1])
    if user and user != auth.user_id(rank):
        return "spoofed"  # authenticated as one worker, routed as another
    return None


def status_row(hb: control.Heartbeat, label: str) -> dict:
    """The dashboard's status row of one heartbeat."""
    return {"kind": "status", "worker": hb.worker, "device": label, "state": hb.state,
            "peer": hb.peer, "round": hb.round, "step": hb.step, "dropped": hb.dropped,
            "drop_reasons": hb.drop_reasons, "speed": hb.speed, "round_steps": hb.round_steps,
            "wait_share": hb.wait_share}


def pair_answers(pairer, msg: control.Avail) -> list[tuple[int, dict]] | str:
    """Asynchronous gossip: the ``pair`` messages a worker's availability makes (to whom, what),
    or why it is dropped."""
    if pairer is None:
        return "avail.algo"  # only asynchronous gossip asks for peers
    try:
        pairings = pairer.finished(msg.worker) if msg.finished else \
            pairer.ready(msg.worker, msg.request)
    except ValueError:
        return "avail.state"  # ready twice, out of step, or after its last
    return [(p.worker, Pair(p.worker, p.peer, p.label).to_wire()) for p in pairings]


def where_in_run(ready: bool, started: bool, last_round: int, rounds: int) -> str:
    """Where a worker was when it failed: rows come at the end of a round, so the round in
    progress is the one after the last row (or the final evaluation after the last round)."""
    if not ready or not started:
        return "before training"
    if last_round + 1 >= rounds:
        return "after its last round"
    return f"in round {last_round + 1}"
