"""The send side of the control plane: every message's to_wire, packed and read back, is the
message again (the launcher's decode for the workers' messages, parse_order for its own)."""
from __future__ import annotations

import pytest

from gasloc_emu.transport import control, orders

EXPECT = control.Expect(workers=3, rounds=5, numel=4, requests=5)
ROW = {"worker": 1, "round": 2, "step": 30, "train_loss": 2.5, "compute_s": 1.0, "comm_s": 0.5,
       "wait_s": 0.1, "bytes_sent": 10, "bytes_recv": 12, "peers": [0, 2], "time_s": 4.0,
       "dropped": 0, "eval_loss": 2.4}
COUNTERS = {"bytes_sent": {0: 10}, "bytes_recv": {2: 12}, "raw_bytes_sent": {0: 40},
            "dropped": 1, "drop_reasons": {"stale": 1}, "wait_s": 0.25}
WORKER_MESSAGES = [
    control.Heartbeat(1, 2, 30, "waiting", 0, {0: 10}, 1, {"stale": 1}, speed=0.5,
                      round_steps=10, wait_share=0.25, arrived={2: 12}),
    control.Heartbeat(0, -1, 0, "starting", None, {}, 0, {}),
    control.Ready(2, "tcp://127.0.0.1:5555", "cpu"),
    control.Metric(1, ROW),
    control.Final(1, 2.4, "float32", 4, COUNTERS),
    control.Departed(2, COUNTERS),
    control.Error(0, "RuntimeError: boom"),
    control.Error(0, "Diverged: nan", {"worker": 0, "round": 3}),
    control.Avail(2, 4, finished=False),
    control.RoundStart(1, 3, waiting=True),
]
ORDERS = [orders.Start({0: "tcp://10.0.0.1:3000", 2: "tcp://10.0.0.3:3000"}, 1.7e9),
          orders.Stop(), orders.Exit(), orders.Pair(1, None, 0), orders.Pair(0, 2, 7),
          orders.Fixings(True, [{"index": 1, "part": "start", "at_s": 10.0, "round": 4}])]


@pytest.mark.parametrize("msg", WORKER_MESSAGES, ids=lambda m: type(m).__name__)
def test_a_workers_message_reads_back_as_itself(msg):
    assert control.decode(control.pack(msg.to_wire()), EXPECT) == msg


@pytest.mark.parametrize("msg", ORDERS, ids=lambda m: type(m).__name__)
def test_a_launchers_message_reads_back_as_itself(msg):
    assert orders.parse_order(control.unpack(control.pack(msg.to_wire()))) == msg


def test_an_order_of_another_shape_is_refused_by_name():
    with pytest.raises(orders.OrderError, match="unknown type 'go'"):
        orders.parse_order({"type": "go"})
    with pytest.raises(orders.OrderError, match="start: fields"):
        orders.parse_order({"type": "start", "peers": {}})
    with pytest.raises(orders.OrderError, match="fixings.released"):
        orders.parse_order({"type": "fixings", "released": 1, "fixings": []})


def test_every_phase_a_worker_process_reports_is_a_state_the_launcher_takes():
    """The heartbeat's state comes from the phases the worker process sets; one the launcher's
    decode does not know is dropped as malformed (a joining successor's were, so it never
    showed on the dashboard and its beats counted as control drops)."""
    import inspect
    import re

    from gasloc_emu.emulator import worker_process
    # every literal assigned to a phase (alone or in a tuple), and the default
    phases = set(re.findall(r'phase = [^"\n]*"(\w+)"', inspect.getsource(worker_process)))
    phases.add(worker_process.WorkerState().phase)
    assert {"starting", "joining", "computing", "communicating", "done"} <= phases
    for phase in sorted(phases):
        status = worker_process.WorkerState(round=1, step=3, phase=phase).status()
        beat = control.Heartbeat.from_wire({"type": "hb", "worker": 1, **status}, EXPECT)
        assert beat.state in control.STATES and beat.state != "communicating", phase
