"""Node infos and statuses in the store, config agreement, and a real TCPStore rendezvous."""
from __future__ import annotations

import itertools
import json
import re
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu import config as C
from gasloc_emu.cluster.rendezvous import (
    CHECKPOINTS_VERSION,
    NODE_LOCAL,
    BackOrder,
    Holdings,
    NodeInfo,
    NodeStatus,
    PruneOrder,
    Rendezvous,
    RendezvousError,
    ResumeOrder,
    Successor,
    check_agreement,
    config_diff,
    config_hash,
    open_store,
    shared_config,
)
from gasloc_emu.cluster.roles import ClusterError, NodeRole, resume_folder
from gasloc_emu.training.checkpoint import Refusal

CFG = C.Config()


def _info(node: int = 0, cfg: C.Config = CFG, *, workers: int = 2, version: str = "0.1.0",
          **kw) -> NodeInfo:
    fields = {"node": node, "host": f"h{node}", "addr": f"10.0.0.{node + 1}", "workers": workers,
              "devices": tuple(f"cuda:{k}" for k in range(workers)),
              "labels": tuple(f"cuda:{k} (gpu {k})" for k in range(workers)),
              "config_hash": config_hash(cfg), "config": shared_config(cfg),
              "version": version, "tc_missing": "", "port_base": 40000 + 100 * node}
    return NodeInfo(**(fields | kw))


def _raw(info: NodeInfo, **change) -> str:
    """``info``'s JSON with fields changed (``None`` drops the field)."""
    tree = json.loads(info.to_json()) | change
    return json.dumps({k: v for k, v in tree.items() if v is not None})


# -- NodeInfo

json_leaf = st.none() | st.booleans() | st.integers(-2**53, 2**53) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
json_tree = st.dictionaries(st.text(max_size=6), st.recursive(
    json_leaf, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.text(max_size=6), kids, max_size=3), max_leaves=10), max_size=5)


@st.composite
def node_infos(draw) -> NodeInfo:
    workers = draw(st.integers(0, 6))
    names = st.lists(st.text(max_size=12), min_size=workers, max_size=workers)
    return NodeInfo(node=draw(st.integers(0, 4095)), host=draw(st.text(max_size=20)),
                    addr=draw(st.text(max_size=20)), workers=workers,
                    devices=draw(names), labels=tuple(draw(names)),
                    config_hash=draw(st.text("0123456789abcdef", max_size=64)),
                    config=draw(json_tree), version=draw(st.text(max_size=10)),
                    tc_missing=draw(st.text(max_size=20)), port_base=draw(st.integers(1, 65535)),
                    ctl_addr=draw(st.text(max_size=20)), hb_addr=draw(st.text(max_size=20)),
                    pid=draw(st.integers(0, 2**22)))


@settings(max_examples=60, deadline=None)
@given(info=node_infos())
def test_node_info_round_trips_through_json(info):
    text = info.to_json()
    assert NodeInfo.from_json(text) == info
    assert NodeInfo.from_json(text.encode()) == info
    back = NodeInfo.from_json(text)
    assert isinstance(back.devices, tuple) and isinstance(back.labels, tuple)


def test_node_info_json_has_sorted_keys_and_lists():
    info = _info(1, ctl_addr="tcp://10.0.0.2:5000")
    raw = json.loads(info.to_json())
    assert list(raw) == sorted(raw)
    assert raw["devices"] == ["cuda:0", "cuda:1"] and raw["node"] == 1
    assert raw["ctl_addr"] == "tcp://10.0.0.2:5000" and raw["pid"] == 0


def test_node_info_keeps_devices_as_tuples_and_is_frozen():
    info = _info(workers=1, devices=["cpu"], labels=["cpu (core 0)"])
    assert info.devices == ("cpu",) and info.labels == ("cpu (core 0)",)
    with pytest.raises(AttributeError):
        info.node = 1  # type: ignore[misc]


def test_node_info_without_the_optional_fields_takes_their_defaults():
    info = NodeInfo.from_json(_raw(_info(), ctl_addr=None, hb_addr=None, pid=None))
    assert (info.ctl_addr, info.hb_addr, info.pid) == ("", "", 0)


@pytest.mark.parametrize(("workers", "devices"), [(2, ("cpu",)), (1, ("cpu", "cpu")), (0, ("a",))])
def test_node_info_with_a_device_count_unlike_its_workers_is_refused(workers, devices):
    with pytest.raises(RendezvousError, match=f"^node 3: {workers} workers but devices "
                                              f"{re.escape(repr(list(devices)))}; expected "
                                              "one string per worker$"):
        _info(3, workers=workers, devices=devices)


def test_node_info_with_a_label_count_unlike_its_workers_is_refused():
    with pytest.raises(RendezvousError, match="node 3: 2 workers"):
        _info(3, workers=2, labels=("cuda:0",))


def test_a_label_count_mismatch_names_the_labels():
    with pytest.raises(RendezvousError, match=r"but labels \['cuda:0'\]"):
        _info(3, workers=2, labels=("cuda:0",))


@pytest.mark.parametrize(("text", "match"), [
    ("", "^node info in the store is not JSON$"),
    ("{node: 1}", "^node info in the store is not JSON$"),
    (b"\xff\xfe\xfd", "^node info in the store is not JSON$"),
    ("[]", "^node info in the store has the wrong fields$"),
    ("null", "^node info in the store has the wrong fields$"),
    ('"node"', "^node info in the store has the wrong fields$"),
])
def test_node_info_that_is_not_a_json_object_is_refused(text, match):
    with pytest.raises(RendezvousError, match=match):
        NodeInfo.from_json(text)


@pytest.mark.parametrize("change", [{"workers": None}, {"node": None}, {"config": None},
                                    {"extra": 1}, {"secret": "x"}])
def test_node_info_with_missing_or_unknown_fields_is_refused(change):
    with pytest.raises(RendezvousError, match="^node info in the store has the wrong fields$"):
        NodeInfo.from_json(_raw(_info(), **change))


@pytest.mark.parametrize(("change", "match"), [
    ({"node": "0"}, "node info: node = '0' is not a int"),
    ({"node": True}, "node info: node = True is not a int"),
    ({"workers": 2.0}, r"node info: workers = 2\.0 is not a int"),
    ({"host": 7}, "node info: host = 7 is not a str"),
    ({"devices": "cuda:0"}, r"node info: devices = 'cuda:0' is not a tuple\[str, \.\.\.\]"),
    ({"labels": {"0": "a"}}, r"node info: labels = \{'0': 'a'\} is not a tuple\[str, \.\.\.\]"),
    ({"config": [1]}, r"node info: config = \[1\] is not a dict"),
    ({"port_base": False}, "node info: port_base = False is not a int"),
    ({"pid": "12"}, "node info: pid = '12' is not a int"),
    ({"ctl_addr": ["tcp://x"]}, r"node info: ctl_addr = \['tcp://x'\] is not a str"),
])
def test_node_info_with_a_field_of_the_wrong_type_is_refused_naming_it(change, match):
    with pytest.raises(RendezvousError, match=f"^{match}$"):
        NodeInfo.from_json(_raw(_info(), **change))


def test_node_info_from_the_store_with_a_device_count_unlike_its_workers_is_refused():
    with pytest.raises(RendezvousError, match="^node 0: 3 workers but devices "):
        NodeInfo.from_json(_raw(_info(), workers=3))


@pytest.mark.parametrize("change", [{"devices": [0, 1]}, {"labels": [None, {"a": 1}]}])
def test_node_info_with_devices_that_are_not_strings_is_refused(change):
    with pytest.raises(RendezvousError, match="expected one string per worker"):
        NodeInfo.from_json(_raw(_info(), **change))


# -- NodeStatus

@settings(max_examples=100, deadline=None)
@given(node=st.integers(0, 4095), beat=st.integers(0, 2**40),
       dead=st.dictionaries(st.integers(0, 4095), st.integers(-255, 255), max_size=6))
def test_node_status_round_trips_through_json(node, beat, dead):
    st_ = NodeStatus(node, beat, dead)
    back = NodeStatus.from_json(st_.to_json())
    assert back == st_
    assert all(type(k) is int and type(v) is int for k, v in back.dead.items())
    assert NodeStatus.from_json(st_.to_json().encode()) == st_


def test_node_status_json_has_string_ranks_and_dead_defaults_to_empty():
    assert json.loads(NodeStatus(2, 7, {5: 137}, {5: 1}).to_json()) == \
        {"node": 2, "beat": 7, "dead": {"5": 137}, "lives": {"5": 1}}
    assert NodeStatus.from_json('{"node": 1, "beat": 3}') == NodeStatus(1, 3, {}, {})
    assert NodeStatus(1, 3).dead == {} and NodeStatus(1, 3).dead is not NodeStatus(2, 3).dead


@pytest.mark.parametrize(("text", "match"), [
    ("beat", "^node status in the store is not JSON$"),
    ('{"node": 1}', "^node status in the store has the wrong fields$"),
    ('{"node": 1, "beat": 2, "dead": {}, "x": 0}', "^node status in the store has the wrong "
                                                   "fields$"),
    ('{"node": 1, "beat": "2"}', "^node status: beat = '2' is not a int$"),
    ('{"node": null, "beat": 2}', "^node status: node = None is not a int$"),
    ('{"node": 1, "beat": true}', "^node status: beat = True is not a int$"),
    ('{"node": 1, "beat": 2, "dead": [3]}', r"^node status: dead = \[3\] is not a dict$"),
    ('{"node": 1, "beat": 2, "dead": {"w1": 3}}', r"^node status has a bad 'dead' map: "
                                                  r"\{'w1': 3\}; expected"),
    ('{"node": 1, "beat": 2, "dead": {"1": null}}', r"^node status has a bad 'dead' map: "
                                                    r"\{'1': None\}; expected"),
    ('{"node": 1, "beat": 2, "dead": {"1": "x"}}', "^node status has a bad 'dead' map"),
    ('{"node": 1, "beat": 2, "dead": {"1": [1]}}', "^node status has a bad 'dead' map"),
])
def test_a_bad_node_status_is_refused_naming_what_is_wrong(text, match):
    with pytest.raises(RendezvousError, match=match):
        NodeStatus.from_json(text)


def test_a_process_count_that_is_not_a_count_is_refused():
    with pytest.raises(RendezvousError, match="bad 'lives' map"):
        NodeStatus.from_json('{"node": 1, "beat": 2, "lives": {"1": -1}}')
    assert NodeStatus.from_json('{"node": 1, "beat": 2, "lives": {"1": 2}}').lives == {1: 2}


def test_a_successor_order_round_trips_and_is_checked():
    order = Successor(4, 1, "tcp://198.18.0.3:40004", 6)
    assert Successor.from_json(order.to_json()) == order
    with pytest.raises(RendezvousError, match="successor order in the store has the wrong"):
        Successor.from_json('{"rank": 4, "life": 1, "addr": "x"}')
    with pytest.raises(RendezvousError, match="start = '6' is not a int"):
        Successor.from_json('{"rank": 4, "life": 1, "addr": "x", "start": "6"}')


@pytest.mark.parametrize("code", ["3.7", "true", '"3"'])
def test_an_exit_code_that_is_not_an_integer_is_refused(code):
    with pytest.raises(RendezvousError, match="bad 'dead' map"):
        NodeStatus.from_json(f'{{"node": 1, "beat": 2, "dead": {{"1": {code}}}}}')


# -- the config the nodes agree on

def test_shared_config_is_the_config_without_the_node_local_settings():
    tree = shared_config(CFG)
    full = C.to_dict(CFG)
    for key in NODE_LOCAL:
        section, name = key.split(".")
        assert name in full[section] and name not in tree[section]
        del full[section][name]
    assert tree == full
    assert tree["run"]["rounds"] == CFG.run.rounds and tree["algo"]["name"] == "gasloc"


NODE_LOCAL_CHANGES = {"run.out_dir": ["runs", "/scratch/r", "elsewhere"],
                      "run.dashboard": ["auto", "on", "off"],
                      "run.threads_per_worker": [0, 1, 16],
                      "run.device": ["auto", "cpu", "cuda"]}


@settings(max_examples=40, deadline=None)
@given(picks=st.fixed_dictionaries({k: st.sampled_from(v) for k, v in NODE_LOCAL_CHANGES.items()}))
def test_node_local_settings_do_not_change_the_hash(picks):
    cfg = C.replace(CFG, **picks)
    assert config_hash(cfg) == config_hash(CFG)
    assert shared_config(cfg) == shared_config(CFG)


@pytest.mark.parametrize("change", [{"seed": 1}, {"workers": 8}, {"algo.name": "dsgd"},
                                    {"run.rounds": 21}, {"net.rate_mbit": 49.5},
                                    {"run.security": "curve"}, {"run.name": "x"},
                                    {"algo.inner.lr": 0.002}])
def test_any_shared_setting_changes_the_hash(change):
    cfg = C.replace(CFG, **change)
    assert config_hash(cfg) != config_hash(CFG)
    assert re.fullmatch(r"[0-9a-f]{64}", config_hash(cfg))
    assert config_diff(shared_config(CFG), shared_config(cfg)) == list(change)


def test_the_hash_is_the_same_for_equal_configs():
    assert config_hash(C.Config()) == config_hash(C.resolve()) == config_hash(CFG)


def test_config_diff_examples():
    a = {"x": 1, "s": {"y": 2, "z": {"w": 3}}, "only_a": 0}
    b = {"x": 1, "s": {"y": 5, "z": {"w": 4}}, "only_b": {"q": 1}}
    assert config_diff(a, b) == ["only_a", "only_b", "s.y", "s.z.w"]
    assert config_diff(a, a) == [] and config_diff({}, {}) == []
    assert config_diff({"s": {"y": 1}}, {"s": 1}) == ["s"]
    assert config_diff({"x": 1}, {"x": 1.0}) == []
    assert config_diff({"x": [1, 2]}, {"x": [2, 1]}) == ["x"]


KEYS = st.sampled_from(["a", "b", "c", "lr", "name"])


@settings(max_examples=100, deadline=None)
@given(tree=st.dictionaries(KEYS, st.recursive(
    st.integers(0, 9), lambda kids: st.dictionaries(KEYS, kids, min_size=1, max_size=3),
    max_leaves=12), min_size=1, max_size=4), data=st.data())
def test_config_diff_finds_exactly_the_changed_leaf(tree, data):
    assert config_diff(tree, tree) == []
    leaves = []

    def walk(node, path):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, [*path, key])
            else:
                leaves.append([*path, key])
    walk(tree, [])
    path = data.draw(st.sampled_from(leaves))
    other = json.loads(json.dumps(tree))
    node = other
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] += 10
    assert config_diff(tree, other) == config_diff(other, tree) == [".".join(path)]


def test_nodes_that_agree_pass():
    check_agreement([_info(0)])
    check_agreement([_info(0), _info(1, workers=1), _info(2, workers=3)])


def test_a_different_version_is_refused_naming_the_node_and_both_versions():
    with pytest.raises(RendezvousError, match=r"^node 1 \(h1\) runs gasloc-emu 0\.2\.0, node 0 "
                                              r"\(h0\) 0\.1\.0$"):
        check_agreement([_info(0), _info(1, version="0.2.0")])


def test_a_different_config_is_refused_naming_the_key_and_both_values():
    other = C.replace(CFG, **{"algo.name": "dsgd"})
    with pytest.raises(RendezvousError, match=r"^node 2 \(h2\) has a different config: algo\.name "
                                              r"= 'gasloc' on node 0, 'dsgd' on node 2; start "
                                              r"every node with the same settings$"):
        check_agreement([_info(0), _info(1), _info(2, other)])


def test_the_first_three_differing_keys_are_shown_and_the_rest_counted():
    other = C.replace(CFG, **{"seed": 9, "workers": 6, "run.rounds": 3, "net.mtu": 9000,
                              "algo.alpha": 0.5})
    with pytest.raises(RendezvousError) as info:
        check_agreement([_info(0), _info(1, other)])
    msg = str(info.value)
    assert "algo.alpha = 1.0 on node 0, 0.5 on node 1, net.mtu = 1500 on node 0, 9000 on " \
           "node 1, run.rounds = 20 on node 0, 3 on node 1 (and 2 more);" in msg
    assert "seed" not in msg and "\n" not in msg


def test_a_key_missing_on_one_node_shows_none():
    tree = shared_config(CFG)
    del tree["fault"]
    with pytest.raises(RendezvousError, match=r"fault = \{.*\} on node 0, None on node 1;"):
        check_agreement([_info(0), _info(1, config=tree, config_hash="x")])


def test_a_differing_hash_over_the_same_config_still_fails():
    with pytest.raises(RendezvousError, match=r"^node 1 \(h1\) has a different config: hash "
                                              "differs; start every node"):
        check_agreement([_info(0), _info(1, config_hash="0" * 64)])


def test_the_version_is_checked_before_the_config():
    other = C.replace(CFG, seed=3)
    with pytest.raises(RendezvousError, match="runs gasloc-emu 9"):
        check_agreement([_info(0), _info(1, other, version="9")])


def test_a_node_that_resumes_beside_one_that_starts_afresh_is_refused():
    with pytest.raises(RendezvousError, match=r"^node 1 \(h1\) resumes \(--resume\), node 0 "
                                              r"\(h0\) starts afresh; give --resume on every"):
        check_agreement([_info(0), _info(1, resuming=1)])
    check_agreement([_info(0, resuming=1), _info(1, resuming=1)])
    with pytest.raises(RendezvousError, match="resuming = 2; expected 0 or 1"):
        _info(1, resuming=2)


# -- checkpoints across hosts: what each node holds, and node 0's orders

HELD = Holdings(CHECKPOINTS_VERSION, 1, {2: (3, 4), 3: (4,)},
                (Refusal(3, 3, "/d/w3-r000003.ckpt: truncated (1 of 2 payload bytes)"),))


def test_holdings_round_trip_and_are_checked_against_the_node_that_sent_them():
    again = Holdings.from_json(HELD.to_json())
    assert again == HELD
    assert again.checked(1, range(2, 4), rounds=8) is again
    for node, ranks, rounds in ((2, range(2, 4), 8), (1, range(1, 4), 8), (1, range(2, 4), 4)):
        with pytest.raises(RendezvousError, match="checkpoint holdings do not fit the run"):
            again.checked(node, ranks, rounds)


@pytest.mark.parametrize("change", [
    {"version": 2}, {"node": -1}, {"held": {"2": [-1]}}, {"held": {"x": [1]}},
    {"held": {"2": [True]}}, {"held": [1]}, {"refused": [{"rank": 3, "round": 3}]},
    {"refused": [{"rank": 3, "round": 3, "why": 5}]}, {"refused": "no"}, {"extra": 1}])
def test_malformed_holdings_from_the_store_are_refused(change):
    raw = json.loads(HELD.to_json()) | change
    with pytest.raises(RendezvousError, match="holdings"):
        Holdings.from_json(json.dumps(raw))


def test_a_refusal_line_from_the_store_is_kept_to_its_length():
    raw = json.loads(HELD.to_json())
    raw["refused"][0]["why"] = "x" * 10_000
    assert len(Holdings.from_json(json.dumps(raw)).refused[0].why) == 1000


@pytest.mark.parametrize("cls", [ResumeOrder, PruneOrder])
@pytest.mark.parametrize("raw, match", [
    ('{"version": 2, "X": 3}', "version 2"), ('{"version": 1, "X": -3}', "not an integer"),
    ('{"version": 1, "X": 3.0}', "not an integer"), ('{"version": 1}', "wrong fields"),
    ("[1]", "wrong fields"), ("{", "not JSON")])
def test_malformed_orders_from_the_store_are_refused(cls, raw, match):
    name = "round" if cls is ResumeOrder else "keep_from"
    with pytest.raises(RendezvousError, match=match):
        cls.from_json(raw.replace("X", name))
    assert cls.from_json(cls(CHECKPOINTS_VERSION, 3).to_json()) == cls(CHECKPOINTS_VERSION, 3)


def test_each_host_names_its_own_folder_of_the_run():
    assert resume_folder("/runs/rec", 0) == Path("/runs/rec")
    assert resume_folder("/runs/rec", 2) == Path("/runs/rec.node2")
    assert resume_folder("/runs/rec.node2", 2) == Path("/runs/rec.node2")


def test_rendezvous_errors_are_cluster_errors():
    assert issubclass(RendezvousError, ClusterError) and issubclass(RendezvousError, ValueError)


# -- a real store on the loopback

def _role(nnodes: int, rank: int, port: int, **kw) -> NodeRole:
    return NodeRole(nnodes=nnodes, node_rank=rank, master_addr="127.0.0.1", master_port=port,
                    source="flags", **kw)


def _flush(*nodes) -> None:
    """Wait until the nodes' writes are in the store: a TCPStore ``set`` gets no reply, so a
    read on another connection can overtake it; a round trip on the writer's own connection
    cannot."""
    for node in nodes:
        (node.store if isinstance(node, Rendezvous) else node).check(["flush"])


@pytest.fixture(scope="module")
def stores():
    """One store for the whole module, hosted by ``open_store`` as node 0 does, and one client
    joined as node 1 does: (host, client, port). Few connections, as each costs (a TCPStore
    client's connect may stall for seconds in a sandbox); every test takes its own prefix."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    role = _role(2, 0, port, store_prefix="gasloc/attempt_1")
    host = open_store(role, timeout_s=10)
    client = open_store(replace(role, node_rank=1), timeout_s=10)
    yield host, client, port
    del client  # the client first, then the host
    del host


_PREFIXES = itertools.count()


@pytest.fixture
def cluster(stores):
    """``nnodes`` -> one Rendezvous per node over the TCPStore, under a fresh prefix: node 0
    uses the host's connection, the others the client's."""
    host, client, port = stores

    def make(nnodes: int) -> list[Rendezvous]:
        prefix = f"test/{next(_PREFIXES)}"
        return [Rendezvous(dist.PrefixStore(prefix, (host if k == 0 else client).underlying_store),
                           _role(nnodes, k, port)) for k in range(nnodes)]

    return make


def test_two_nodes_publish_and_each_gathers_both_in_node_order(cluster):
    n0, n1 = cluster(2)
    infos = [_info(0, ctl_addr="tcp://127.0.0.1:7000"), _info(1, workers=3)]
    n1.publish(infos[1])
    n0.publish(infos[0])
    assert n0.gather(timeout_s=2) == infos
    assert n1.gather(timeout_s=2) == infos


def test_gather_waits_for_a_node_that_publishes_late(cluster):
    n0, n1 = cluster(2)
    n0.publish(_info(0))
    late = threading.Timer(0.2, n1.publish, args=(_info(1),))
    late.start()
    try:
        t0 = time.monotonic()
        infos = n0.gather(timeout_s=3)
        assert 0.15 < time.monotonic() - t0 < 2
    finally:
        late.join()
    assert [i.node for i in infos] == [0, 1]


def test_gather_refuses_a_node_with_a_different_config_naming_the_key(cluster):
    n0, n1 = cluster(2)
    n0.publish(_info(0))
    n1.publish(_info(1, C.replace(CFG, **{"run.rounds": 7})))
    for node in (n0, n1):
        with pytest.raises(RendezvousError, match=r"^node 1 \(h1\) has a different config: "
                                                  r"run\.rounds = 20 on node 0, 7 on node 1;"):
            node.gather(timeout_s=2)


def test_gather_times_out_naming_the_missing_node(cluster):
    n0, _, n2 = cluster(3)
    n0.publish(_info(0))
    n2.publish(_info(2))
    t0 = time.monotonic()
    with pytest.raises(RendezvousError, match=r"^nodes \[1\] did not join within 0.3 s$"):
        n0.gather(timeout_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 1.5


def test_gather_times_out_naming_every_missing_node(cluster):
    _, n1, _, _ = cluster(4)
    n1.publish(_info(1))
    with pytest.raises(RendezvousError, match=r"^nodes \[0, 2, 3\] did not join"):
        n1.gather(timeout_s=0.2)


def test_gather_refuses_an_info_under_another_nodes_key(cluster):
    n0, n1 = cluster(2)
    n0.publish(_info(0))
    n1.store.set("node/1", _info(0).to_json())
    _flush(n1)
    with pytest.raises(RendezvousError, match="^the store's node/1 says it is node 0$"):
        n0.gather(timeout_s=2)


def test_gather_refuses_garbage_in_the_store(cluster):
    n0, n1 = cluster(2)
    n0.publish(_info(0))
    n1.store.set("node/1", "hello")
    _flush(n1)
    with pytest.raises(RendezvousError, match="^node info in the store is not JSON$"):
        n0.gather(timeout_s=2)


def test_beats_show_in_the_status_with_the_dead_workers(cluster):
    n0, n1 = cluster(2)
    assert n0.status(1) is None and n1.status(0) is None
    n1.beat({})
    _flush(n1)
    assert n0.status(1) == NodeStatus(1, 1, {})
    n1.beat({3: 137, 4: 1})
    _flush(n1)
    assert n0.status(1) == NodeStatus(1, 2, {3: 137, 4: 1})
    n0.beat({})
    _flush(n0)
    assert n1.status(0) == NodeStatus(0, 1, {}) and n0.status(0) == NodeStatus(0, 1, {})


def test_silent_s_counts_from_the_last_change_of_the_beat(cluster):
    n0, n1 = cluster(2)
    assert n0.silent_s(1, now=100.0) == 0.0          # first look: no beat yet
    assert n0.silent_s(1, now=103.5) == 3.5          # still none
    n1.beat({})
    _flush(n1)
    assert n0.silent_s(1, now=110.0) == 0.0          # the beat changed
    assert n0.silent_s(1, now=112.0) == 2.0
    assert n0.silent_s(1, now=130.0) == 20.0
    n1.beat({})
    _flush(n1)
    assert n0.silent_s(1, now=131.0) == 0.0
    assert n0.silent_s(1, now=131.25) == 0.25
    assert n1.silent_s(1, now=5.0) == 0.0            # each watcher keeps its own clock


@settings(max_examples=10, deadline=None)
@given(steps=st.lists(st.tuples(st.booleans(), st.floats(0, 100)), min_size=1, max_size=12))
def test_silent_s_is_the_time_since_the_watcher_last_saw_a_new_beat(steps):
    rdv = Rendezvous(_DictStore(), _role(2, 0, 29400))
    peer = Rendezvous(rdv.store, _role(2, 1, 29400))
    now, since = 0.0, 0.0
    assert rdv.silent_s(1, now) == 0.0
    for beats, dt in steps:
        now += dt
        if beats:
            peer.beat({})
            since = now
        assert rdv.silent_s(1, now) == pytest.approx(now - since)


class _DictStore:
    """The three store calls Rendezvous makes, in memory (for the property test only)."""

    def __init__(self):
        self.kv: dict[str, bytes] = {}

    def set(self, key, value):
        self.kv[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.kv[key]

    def check(self, keys):
        return all(k in self.kv for k in keys)


def test_node_0_gathers_holdings_and_the_others_take_its_round(cluster):
    n0, n1 = cluster(2)
    n1.publish_holdings(HELD)
    assert n0.gather_holdings(timeout_s=2) == [HELD]
    n0.order_resume(ResumeOrder(CHECKPOINTS_VERSION, 4))
    _flush(n0)
    assert n1.resume_order(timeout_s=2) == ResumeOrder(CHECKPOINTS_VERSION, 4)
    assert n1.prune_order() is None
    n0.order_prune(PruneOrder(CHECKPOINTS_VERSION, 3))
    _flush(n0)
    assert n1.prune_order() == PruneOrder(CHECKPOINTS_VERSION, 3)


def test_a_node_waiting_for_the_round_learns_that_node_0_found_none(cluster):
    n0, n1 = cluster(2)
    n0.end("failed", "no round that every worker of 0..3 has a whole checkpoint")
    _flush(n0)
    with pytest.raises(RendezvousError, match="^node 0 chose no round to resume from: no round"):
        n1.resume_order(timeout_s=2)
    with pytest.raises(RendezvousError, match=r"^nodes \[1\] did not say which checkpoints"):
        cluster(2)[0].gather_holdings(timeout_s=0.2)


def test_the_end_is_seen_by_every_node(cluster):
    n0, n1 = cluster(2)
    assert n0.ended() is None and n1.ended() is None
    n0.end("done", None)
    _flush(n0)
    assert n1.ended() == {"status": "done", "error": None} == n0.ended()
    n0.end("failed", "worker 3 exited with code 1")
    _flush(n0)
    assert n1.ended() == {"status": "failed", "error": "worker 3 exited with code 1"}


@pytest.mark.parametrize("raw", ["[1]", "null", '{"error": "x"}', '{"status": 1}', '"done"'])
def test_a_malformed_end_record_is_refused(cluster, raw):
    n0, n1 = cluster(2)
    n0.store.set("end", raw)
    _flush(n0)
    with pytest.raises(RendezvousError, match="^the store's end record is malformed$"):
        n1.ended()


def test_an_end_record_that_is_not_json_is_refused(cluster):
    n0, n1 = cluster(2)
    n0.store.set("end", "done")
    _flush(n0)
    with pytest.raises(RendezvousError, match="end record"):
        n1.ended()


def test_wait_left_returns_at_once_when_every_node_has_left(cluster):
    n0, n1, n2 = cluster(3)
    n1.leave()
    n2.leave()
    _flush(n1, n2)
    t0 = time.monotonic()
    assert n0.wait_left(timeout_s=2) == []
    assert time.monotonic() - t0 < 0.5


def test_wait_left_waits_for_a_node_that_leaves_late(cluster):
    n0, n1, n2 = cluster(3)
    n1.leave()
    late = threading.Timer(0.2, n2.leave)
    late.start()
    try:
        t0 = time.monotonic()
        assert n0.wait_left(timeout_s=3) == []
        assert 0.15 < time.monotonic() - t0 < 2
    finally:
        late.join()


def test_wait_left_names_the_nodes_that_never_left(cluster):
    n0, _, n2, _ = cluster(4)
    n2.leave()
    _flush(n2)
    t0 = time.monotonic()
    assert n0.wait_left(timeout_s=0.3) == [1, 3]
    assert 0.3 <= time.monotonic() - t0 < 1.5


def test_wait_left_does_not_wait_for_a_silent_node(cluster):
    n0, n1, n2 = cluster(3)
    n1.beat({})
    n2.beat({})
    _flush(n1, n2)
    long_ago = time.monotonic() - 10
    assert n0.silent_s(1, long_ago) == 0.0 and n0.silent_s(2, long_ago) == 0.0
    n1.beat({})  # node 1 is alive; node 2's beats stopped 10 s ago
    _flush(n1)
    t0 = time.monotonic()
    assert n0.wait_left(timeout_s=0.3, silent_after_s=2.0) == [1]
    assert time.monotonic() - t0 >= 0.3
    assert n0.wait_left(timeout_s=0.3, silent_after_s=60.0) == [1, 2]


def test_wait_left_on_a_single_node_has_no_one_to_wait_for(cluster):
    (n0,) = cluster(1)
    t0 = time.monotonic()
    assert n0.wait_left(timeout_s=5) == []
    assert time.monotonic() - t0 < 0.5


def test_wait_left_with_no_time_still_sees_who_has_left(cluster):
    n0, n1 = cluster(2)
    n1.leave()
    _flush(n1)
    assert n0.wait_left(timeout_s=0) == []


# -- open_store

def test_the_store_keeps_each_prefix_apart(stores):
    host, client, _ = stores
    other = dist.PrefixStore("gasloc/attempt_2", client.underlying_store)
    host.set("node/0", "a")
    _flush(host)
    assert client.check(["node/0"]) and client.get("node/0") == b"a"
    assert not other.check(["node/0"])
    assert host.underlying_store.get("gasloc/attempt_1/node/0") == b"a"


def test_with_the_agent_store_node_0_joins_as_a_client(stores):
    host, _, port = stores  # here the module's host plays torchrun's agent
    role = _role(2, 0, port, use_agent_store=True, store_prefix="gasloc/attempt_0")
    store = open_store(role, timeout_s=10)
    store.set("end", "x")
    _flush(store)
    assert host.underlying_store.get("gasloc/attempt_0/end") == b"x"
    assert not host.check(["end"])  # not under the module's own prefix


def test_a_port_already_taken_is_refused_naming_the_node_and_address(stores):
    host, _, port = stores
    with pytest.raises(RendezvousError, match=f"^node 0 could not host the store on "
                                              f"127\\.0\\.0\\.1:{port}: [^\n]+$"):
        open_store(_role(2, 0, port), timeout_s=2)
    host.set("k", "still up")
    assert host.get("k") == b"still up"


# -- a lost node that comes back


def test_a_back_order_round_trips_and_a_malformed_one_is_refused():
    order = BackOrder(CHECKPOINTS_VERSION, 2, 77, 9, {3: 1, 4: 2}, {3: "tcp://h:1", 4: "tcp://h:2"})
    assert BackOrder.from_json(order.to_json()) == order
    refused = BackOrder(CHECKPOINTS_VERSION, 2, 77, 0, {}, {}, "it now runs 2 workers")
    assert BackOrder.from_json(refused.to_json()) == refused
    raw = json.loads(order.to_json())
    for change in ({"start": -1}, {"lives": {"3": 1}}, {"addrs": {"3": "ipc://x", "4": "y"}},
                   {"lives": {"x": 1, "4": 1}}, {"refused": 3}):
        with pytest.raises(RendezvousError, match="back order in the store is malformed"):
            BackOrder.from_json(json.dumps(raw | change))
    with pytest.raises(RendezvousError, match="version 2"):
        BackOrder.from_json(json.dumps(raw | {"version": 2}))


def test_a_restarted_agent_finds_the_run_under_way_asks_back_and_gets_its_answer(cluster):
    """Node 0 marks the run started; an agent that joins then reads every node's info as
    published at the start, asks to come back, and waits for node 0's answer to its own
    process; an answer for another process or the run's end is not taken for it."""
    n0, n1 = cluster(2)
    infos = [_info(0), _info(1, workers=3)]
    n0.publish(infos[0])
    n1.publish(infos[1])
    assert not n1.running()
    n0.mark_running()
    _flush(n0)
    assert n1.running() and n1.published() == infos
    again = replace(infos[1], pid=4242)
    assert n0.back_request(1) is None
    held = Holdings(CHECKPOINTS_VERSION, 1, {1: (0, 1), 2: (1,), 3: ()})
    n1.ask_back(again, held)
    _flush(n1)
    assert n0.back_request(1) == again and n0.back_holdings(1, 4242) == held
    order = BackOrder(CHECKPOINTS_VERSION, 1, 4242, 7, {1: 1, 2: 1, 3: 1},
                      {r: f"tcp://h:{r}" for r in (1, 2, 3)})
    threading.Timer(0.2, n0.answer_back, args=(order,)).start()
    assert n1.back_order(1, 4242, timeout_s=5) == order
    with pytest.raises(RendezvousError, match="did not take node 1 back within 0.3 s"):
        n1.back_order(1, 999, timeout_s=0.3)
    n0.end("ok", None)
    _flush(n0)
    with pytest.raises(RendezvousError, match=r"the run ended \(ok\) before node 0 took"):
        n1.back_order(1, 999, timeout_s=5)
