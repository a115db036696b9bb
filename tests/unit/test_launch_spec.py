"""The launcher-worker contract: JSON round-trip and field-by-field checks."""
from __future__ import annotations

import json

import pytest

from gasloc_emu.emulator.launch_spec import LaunchSpec, SpecError


def _spec(**over) -> LaunchSpec:
    base = dict(ctl_addr="ipc:///tmp/x/ctl.sock", heartbeat_addr="ipc:///tmp/x/hb.sock",
                devices=("cpu", "cpu"), bind_addrs=("tcp://127.0.0.1:0",) * 2, shaping=None,
                threads=1, heartbeat_s=0.5, peer_timeout_s=600.0, start_timeout_s=360.0,
                exit_timeout_s=3600.0, link_ports=False)
    return LaunchSpec(**(base | over))


def test_round_trip_through_json_and_file(tmp_path):
    spec = _spec(shaping={"mode": "userspace", "links": [[0, 1, 5.0, 0.0]]})
    assert LaunchSpec.from_json(spec.to_json()) == spec
    spec.write(tmp_path)
    assert LaunchSpec.read(tmp_path) == spec
    assert spec.workers == 2


def test_missing_and_unknown_fields_are_named():
    raw = json.loads(_spec().to_json())
    del raw["threads"]
    raw["thread"] = 1
    with pytest.raises(SpecError, match=r"missing \['threads'\], unknown \['thread'\]"):
        LaunchSpec.from_json(json.dumps(raw))


@pytest.mark.parametrize("field, value", [
    ("threads", 0), ("threads", 1.5), ("threads", True), ("heartbeat_s", 0),
    ("peer_timeout_s", float("nan")), ("ctl_addr", 3), ("devices", ("cpu",)),
    ("devices", ()), ("shaping", [1]), ("bind_addrs", (1, 2)), ("link_ports", 1),
])
def test_bad_field_is_refused_with_its_name(field, value):
    with pytest.raises(SpecError, match=field if field != "devices" else "devices"):
        _spec(**{field: value})


def test_not_json_is_one_error():
    with pytest.raises(SpecError, match="not JSON"):
        LaunchSpec.from_json("{")
