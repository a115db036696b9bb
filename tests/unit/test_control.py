"""Control messages: every field of every type checked; anything else is a ControlError.

The launcher acts only on what ``control.parse`` returns, so these tests pin what it accepts
(the workers' real messages), what it refuses and why (the reason its drop counter shows), and
that no input, however odd, makes it raise anything but ControlError.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gasloc_emu.transport import control
from gasloc_emu.transport.control import ControlError, Expect

EXPECT = Expect(workers=4, rounds=5, numel=6)
MISSING = object()  # a field left out

ROW = {"worker": 1, "round": 2, "step": 30, "train_loss": 3.5, "compute_s": 0.25, "comm_s": 0.5,
       "wait_s": 0.125, "bytes_sent": 1000, "bytes_recv": 900, "peers": [0, 2], "time_s": 7.5,
       "dropped": 0}
COUNTERS = {"bytes_sent": {0: 10, 2: 20}, "bytes_recv": {0: 10},
            "raw_bytes_sent": {0: 40, 2: 80}, "dropped": 3, "wait_s": 1.5,
            "drop_reasons": {"stale": 2, "duplicate": 1}}
VALID = {
    "hb": {"type": "hb", "worker": 1, "round": 2, "step": 30, "state": "waiting", "peer": 2,
           "sent": {0: 10, 2: 20}, "dropped": 3, "drop_reasons": {"stale": 2, "duplicate": 1}},
    "ready": {"type": "ready", "worker": 1, "addr": "tcp://198.18.0.2:40123", "device": "cuda:0"},
    "metric": {"type": "metric", "worker": 1, "row": ROW},
    "final": {"type": "final", "worker": 1, "eval_loss": 3.25, "dtype": "float32", "numel": 6,
              "counters": COUNTERS},
    "departed": {"type": "departed", "worker": 1, "counters": COUNTERS},
    "error": {"type": "error", "worker": 1, "error": "InjectedFault: worker 1 raise at round 2"},
    "avail": {"type": "avail", "worker": 1, "request": 3, "finished": False},
    "round": {"type": "round", "worker": 2, "round": 4, "waiting": True},
}
PARSED = {
    "hb": control.Heartbeat(1, 2, 30, "waiting", 2, {0: 10, 2: 20}, 3,
                            {"stale": 2, "duplicate": 1}),
    "ready": control.Ready(1, "tcp://198.18.0.2:40123", "cuda:0"),
    "metric": control.Metric(1, ROW),
    "final": control.Final(1, 3.25, "float32", 6, COUNTERS),
    "departed": control.Departed(1, COUNTERS),
    "error": control.Error(1, "InjectedFault: worker 1 raise at round 2"),
    "avail": control.Avail(1, 3, False),
    "round": control.RoundStart(2, 4, True),
}


def changed(kind: str, path: str, value) -> dict:
    """VALID[kind] with the field at dotted ``path`` set to ``value`` (or left out)."""
    return set_field(copy.deepcopy(VALID[kind]), path, value)


def set_field(wire: dict, path: str, value) -> dict:
    *parents, name = path.split(".")
    node = wire
    for p in parents:
        if not isinstance(node.get(p), dict):  # an earlier change replaced it
            node[p] = {}
        node = node[p]
    if value is MISSING:
        node.pop(name, None)
    else:
        node[name] = value
    return wire


def refused(wire, reason: str) -> ControlError:
    with pytest.raises(ControlError) as info:
        control.parse(wire, EXPECT)
    assert info.value.reason == reason, str(info.value)
    return info.value


@pytest.mark.parametrize("kind", list(VALID))
def test_each_valid_message_round_trips_through_msgpack(kind):
    msg = control.decode(control.pack(VALID[kind]), EXPECT)
    assert type(msg) is control.MESSAGES[kind] and msg == PARSED[kind]


def test_what_the_workers_really_send_is_accepted():
    """The schema follows its producers: WorkerState.status() and a RoundStats row."""
    from gasloc_emu.emulator.worker_process import WorkerState
    from gasloc_emu.training.worker import RoundStats

    class Mailbox:
        delivered = [4, 0, 0, 9]

    class Transport:
        waiting_for, bytes_sent, mailbox = 3, {0: 5, 3: 7}, Mailbox()

        def counters(self):
            return {"dropped": 2, "drop_reasons": {"round": 1, "header": 1}}

    beat = {"type": "hb", "worker": 1} | WorkerState(2, 30, "communicating", Transport()).status()
    hb = control.decode(control.pack(beat), EXPECT)
    assert (hb.state, hb.peer, hb.sent, hb.dropped) == ("waiting", 3, {0: 5, 3: 7}, 2)
    assert hb.arrived == {0: 4, 3: 9}
    starting = {"type": "hb", "worker": 0} | WorkerState().status()
    assert control.parse(starting, EXPECT).round == -1
    stats = RoundStats(1, 4, 50, 3.0, 0.5, 0.25, 0.0, 10, 10, [0, 2], eval_loss=3.5)
    row = stats.as_dict() | {"time_s": 9.0, "dropped": 0}
    assert control.parse({"type": "metric", "worker": 1, "row": row}, EXPECT).row == row


def test_rank_keys_may_be_decimal_text():
    hb = control.parse(changed("hb", "sent", {"0": 10, "3": 1}), EXPECT)
    assert hb.sent == {0: 10, 3: 1}
    refused(changed("hb", "sent", {0: 1, "0": 2}), "hb.sent")  # the same rank twice


def test_the_probe_heartbeat_is_refused():
    probe = {"type": "hb", "worker": 0, "sent": {"x": "y"}}
    refused(probe, "hb.fields")
    refused(changed("hb", "sent", {"x": "y"}), "hb.sent")  # even with every other field right


@pytest.mark.parametrize("kind, path, value, reason", [
    ("hb", "worker", 4, "hb.worker"),
    ("hb", "worker", -1, "hb.worker"),
    ("hb", "worker", True, "hb.worker"),
    ("hb", "worker", "1", "hb.worker"),
    ("hb", "round", 5, "hb.round"),
    ("hb", "round", -2, "hb.round"),
    ("hb", "round", 2.0, "hb.round"),
    ("hb", "step", -1, "hb.step"),
    ("hb", "state", "dancing", "hb.state"),
    ("hb", "state", None, "hb.state"),
    ("hb", "peer", 1, "hb.peer"),  # itself
    ("hb", "peer", 9, "hb.peer"),
    ("hb", "sent", {0: -1}, "hb.sent"),
    ("hb", "sent", {7: 1}, "hb.sent"),
    ("hb", "sent", {"01": 1}, "hb.sent"),
    ("hb", "sent", {0: 1.5}, "hb.sent"),
    ("hb", "sent", [1, 2], "hb.sent"),
    ("hb", "sent", {r: 1 for r in range(5)}, "hb.sent"),
    ("hb", "dropped", 4, "hb.dropped"),  # the reasons add up to 3
    ("hb", "dropped", -1, "hb.dropped"),
    ("hb", "drop_reasons", {"Stale Messages!": 3}, "hb.drop_reasons"),
    ("hb", "drop_reasons", {"stale": -3}, "hb.drop_reasons"),
    ("hb", "drop_reasons", {f"r{i}": 0 for i in range(65)}, "hb.drop_reasons"),
    ("hb", "drop_reasons", None, "hb.drop_reasons"),
    ("hb", "extra", 1, "hb.fields"),
    ("hb", "state", MISSING, "hb.fields"),
    ("ready", "addr", "tcp://*:5555", "ready.addr"),
    ("ready", "addr", "tcp://host:99999", "ready.addr"),
    ("ready", "addr", "ipc:///tmp/x", "ready.addr"),
    ("ready", "addr", "tcp://h\x1b[2J:1", "ready.addr"),
    ("ready", "addr", "tcp://" + "h" * 300 + ":1", "ready.addr"),
    ("ready", "addr", 5, "ready.addr"),
    ("ready", "device", "cuda:0; rm -rf", "ready.device"),
    ("ready", "device", "", "ready.device"),
    ("metric", "row", [1], "metric.row"),
    ("metric", "row.worker", 2, "metric.row.worker"),  # someone else's row
    ("metric", "row.round", 5, "metric.row.round"),
    ("metric", "row.train_loss", math.nan, "metric.row.train_loss"),
    ("metric", "row.train_loss", "3.5", "metric.row.train_loss"),
    ("metric", "row.compute_s", -0.1, "metric.row.compute_s"),
    ("metric", "row.wait_s", math.inf, "metric.row.wait_s"),
    ("metric", "row.bytes_sent", False, "metric.row.bytes_sent"),
    ("metric", "row.peers", [0, 4], "metric.row.peers"),
    ("metric", "row.peers", (0, 2), "metric.row.peers"),
    ("metric", "row.eval_loss", None, "metric.row.eval_loss"),
    ("metric", "row.time_s", 10**400, "metric.row.time_s"),
    ("metric", "row.dropped", MISSING, "metric.row.fields"),
    ("metric", "row.surprise", 1, "metric.row.fields"),
    ("metric", "row.step_span_s", [2.0, 1.0], "metric.row.step_span_s"),   # ends before it starts
    ("metric", "row.step_span_s", [1.0], "metric.row.step_span_s"),
    ("metric", "row.step_span_s", [1.0, math.nan], "metric.row.step_span_s"),
    ("metric", "row.exchange_spans_s", [[0.0, 1.0]] * 9, "metric.row.exchange_spans_s"),
    ("metric", "row.exchange_spans_s", [[0.0, "1"]], "metric.row.exchange_spans_s"),
    ("final", "eval_loss", math.nan, "final.eval_loss"),
    ("final", "dtype", "int64", "final.dtype"),
    ("final", "dtype", "__class__", "final.dtype"),
    ("final", "numel", 7, "final.numel"),
    ("final", "numel", 6.0, "final.numel"),
    ("final", "counters", None, "final.counters"),
    ("final", "counters.wait_s", -1.0, "final.counters.wait_s"),
    ("final", "counters.bytes_sent", {"x": 1}, "final.counters.bytes_sent"),
    ("final", "counters.bytes_recv", {0: "10"}, "final.counters.bytes_recv"),
    ("final", "counters.dropped", 0, "final.counters.dropped"),
    ("final", "counters.drop_reasons", {1: 3}, "final.counters.drop_reasons"),
    ("final", "counters.extra", 0, "final.counters.fields"),
    ("departed", "counters", None, "departed.counters"),
    ("departed", "counters.bytes_sent", {"x": 1}, "departed.counters.bytes_sent"),
    ("departed", "counters.dropped", 0, "departed.counters.dropped"),
    ("departed", "worker", 7, "departed.worker"),
    ("departed", "counters", MISSING, "departed.fields"),
    ("error", "error", "", "error.error"),
    ("error", "error", "x" * (control.MAX_ERROR_CHARS + 1), "error.error"),
    ("error", "error", "boom \x1b]0;pwned\x07", "error.error"),
    ("error", "error", b"bytes", "error.error"),
    ("error", "diverged_at", {"worker": 1}, "error.diverged_at.fields"),
    ("error", "diverged_at", {"worker": 1, "round": 9}, "error.diverged_at"),
    ("avail", "finished", 1, "avail.finished"),
    ("avail", "finished", MISSING, "avail.fields"),
    ("avail", "request", -1, "avail.request"),
    ("avail", "request", 5, "avail.request"),   # past the run's last request (as many as rounds)
    ("avail", "request", 2.0, "avail.request"),
    ("avail", "step", 3, "avail.fields"),
    ("avail", "worker", 7, "avail.worker"),
    ("round", "waiting", 0, "round.waiting"),
    ("round", "waiting", MISSING, "round.fields"),
    ("round", "round", 5, "round.round"),   # past the run's last round
    ("round", "round", -1, "round.round"),
    ("round", "worker", 7, "round.worker"),
])
def test_every_field_is_checked(kind, path, value, reason):
    refused(changed(kind, path, value), reason)


def test_a2cid2_s_requests_are_bounded_by_its_rate_not_by_rounds():
    many = control.Expect(EXPECT.workers, EXPECT.rounds, EXPECT.numel, requests=4 * EXPECT.rounds)
    assert control.parse(changed("avail", "request", 4 * EXPECT.rounds - 1), many).request \
        == 4 * EXPECT.rounds - 1
    with pytest.raises(ControlError):
        control.parse(changed("avail", "request", 4 * EXPECT.rounds), many)


def test_optional_fields_are_taken_when_valid():
    row = control.parse(changed("metric", "row.step_span_s", [1.0, 1.5]), EXPECT).row
    assert row["step_span_s"] == [1.0, 1.5]
    spans = [[0.0, 0.5], [0.5, 0.5]]
    assert control.parse(changed("metric", "row.exchange_spans_s", spans), EXPECT).row[
        "exchange_spans_s"] == spans
    assert control.parse(changed("final", "eval_loss", None), EXPECT).eval_loss is None
    assert control.parse(changed("hb", "peer", None), EXPECT).peer is None
    err = control.parse(changed("error", "diverged_at", {"worker": 1, "round": 2}), EXPECT)
    assert err.diverged_at == {"worker": 1, "round": 2}
    assert control.parse(changed("error", "error", "two\nlines\tok"), EXPECT).error


@pytest.mark.parametrize("msg, reason", [
    ({"type": "nope", "worker": 0}, "type"),
    ({"type": "start", "peers": {}}, "type"),  # the launcher's own messages are not taken in
    ({"type": "__init__"}, "type"),
    ({"type": 3}, "type"),
    ({"worker": 0}, "type"),
    ([1, 2], "map"),
    ({"type": "invalid"}, "undecodable"),
])
def test_unknown_types_and_non_maps_are_refused(msg, reason):
    refused(msg, reason)


@pytest.mark.parametrize("raw", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\x81\x01\x02",
                                 control.pack({"type": "hb"}) + b"extra"])
def test_undecodable_bytes_are_refused(raw):
    with pytest.raises(ControlError) as info:
        control.decode(raw, EXPECT)
    assert info.value.reason == "undecodable"


def test_final_frames_are_checked_against_the_dtype_allow_list_and_size():
    t = torch.arange(6, dtype=torch.float32)
    frame = bytes(control.tensor_frame(t))
    assert torch.equal(control.frame_tensor(frame, "float32", 6), t)
    for bad in ("int64", "Tensor", "__class__", "float"):
        with pytest.raises(ControlError, match="final.dtype"):
            control.frame_tensor(frame, bad, 6)
    with pytest.raises(ControlError, match="final.frame"):
        control.frame_tensor(frame, "float32", 5)
    with pytest.raises(ControlError, match="final.frame"):
        control.frame_tensor(frame[:-1], "float32", 6)


# -- fuzzing: whatever comes in, a valid message or a ControlError comes out

_SCALARS = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
            | st.text(max_size=20) | st.binary(max_size=20))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
    st.text(max_size=8) | st.integers(-5, 10), inner, max_size=5), max_leaves=20)
_FIELDS = sorted({k for wire in VALID.values() for k in wire} | set(ROW) | set(COUNTERS))
_MAPS = st.dictionaries(st.sampled_from(_FIELDS) | st.text(max_size=8) | st.integers(-9, 2**63),
                        _VALUES, max_size=10)


def _outcome(wire) -> str:
    try:
        msg = control.decode(control.pack(wire), EXPECT)
    except ControlError as exc:
        assert isinstance(exc.reason, str) and len(exc.reason) < 40
        return "refused"
    assert isinstance(msg, tuple(control.MESSAGES.values()))
    return "taken"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(list(VALID)) | st.text(max_size=6), body=_MAPS)
def test_fuzzed_maps_give_a_message_or_a_control_error(kind, body):
    _outcome(body | {"type": kind})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(list(VALID)), data=st.data())
def test_fuzzed_fields_of_valid_messages_give_a_message_or_a_control_error(kind, data):
    """One or two fields of a valid message replaced by anything: the checks run deep."""
    paths = [k for k in VALID[kind] if k != "type"]
    paths += {"metric": [f"row.{k}" for k in ROW],
              "final": [f"counters.{k}" for k in COUNTERS]}.get(kind, [])
    wire = copy.deepcopy(VALID[kind])
    for _ in range(data.draw(st.integers(1, 2))):
        set_field(wire, data.draw(st.sampled_from(paths)), data.draw(_VALUES))
    _outcome(wire)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=64))
def test_fuzzed_bytes_give_a_control_error(raw):
    with pytest.raises(ControlError):
        control.decode(raw, EXPECT)


def test_an_answer_read_while_polling_for_a_stop_is_kept_for_its_wait():
    """A worker polls its control socket for a stop while it waits on peers; what else it
    reads then (an answer, a decision) is not lost: the next wait for it returns it."""
    import time

    import zmq

    from gasloc_emu.transport import orders
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        router.bind("inproc://ctl-test")
        ctl = control.WorkerControl(ctx, "inproc://ctl-test", 0)
        ctl.send(control.Ready(0, "tcp://198.18.0.2:40123", "cpu"))
        who, _ = router.recv_multipart()
        router.send_multipart([who, control.pack(orders.Fixings(False, []).to_wire())])
        router.send_multipart([who, control.pack(orders.Stop().to_wire())])
        for _ in range(100):   # both read while polling
            if ctl.poll_stop():
                break
            time.sleep(0.01)
        assert ctl.stop_requested
        assert isinstance(ctl.wait_for(orders.Fixings, 0.01), orders.Fixings)
        ctl.close()
        router.close()
    finally:
        ctx.term()
