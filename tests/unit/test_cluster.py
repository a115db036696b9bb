"""Which node this process is (flags, torchrun, Slurm), the worker split, the secret, the route."""
from __future__ import annotations

import hashlib
import os
import re
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gasloc_emu.cluster import roles as cluster
from gasloc_emu.cluster.roles import (
    DEFAULT_PORT,
    MIN_SECRET_BYTES,
    SECRET_ENV,
    ClusterError,
    NodeRole,
    blocks,
    check_split,
    default_share,
    load_secret,
    resolve_role,
    route_address,
    slurm_first_host,
)

NO_FLAGS = {"nnodes": None, "node_rank": None, "master_addr": None, "master_port": None,
            "nproc_per_node": None}
TORCHRUN = {"GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
            "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}
SLURM = {"SLURM_NODEID": "1", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "gpu[03-05,9],cpu1",
         "SLURM_JOB_ID": "1234"}


def _flags(**given_flags) -> dict:
    return {**NO_FLAGS, **given_flags}


# -- NodeRole

def test_the_default_role_is_a_single_host_master():
    role = NodeRole()
    assert (role.nnodes, role.node_rank, role.master_addr, role.master_port, role.source) == \
        (1, 0, "127.0.0.1", DEFAULT_PORT, "single")
    assert not role.multi and role.is_master and not role.use_agent_store
    assert role.store_prefix == "gasloc" and role.nproc_per_node == 0


@pytest.mark.parametrize(("nnodes", "rank"), [(2, 0), (2, 1), (5, 4), (4096, 4095)])
def test_only_rank_0_is_master_and_more_than_one_node_is_multi(nnodes, rank):
    role = NodeRole(nnodes=nnodes, node_rank=rank)
    assert role.multi and role.is_master == (rank == 0)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"nnodes": 0}, r"nnodes = 0 is out of range; expected an integer in \[1, 4096\]"),
    ({"nnodes": 4097}, r"nnodes = 4097 is out of range"),
    ({"nnodes": True}, r"nnodes = True is out of range"),
    ({"nnodes": 2.0}, r"nnodes = 2.0 is out of range"),
    ({"nnodes": 2, "node_rank": 2}, r"node_rank = 2 is out of range; .* \[0, 1\]"),
    ({"node_rank": -1}, r"node_rank = -1 is out of range; .* \[0, 0\]"),
    ({"master_port": 0}, r"master_port = 0 is out of range; .* \[1, 65535\]"),
    ({"master_port": 65536}, r"master_port = 65536 is out of range"),
    ({"master_port": "29500"}, r"master_port = '29500' is out of range"),
    ({"nproc_per_node": -1}, r"nproc_per_node = -1 is out of range; .* \[0, 4096\]"),
    ({"source": "mpi"}, r"source = 'mpi' is not allowed; expected one of single, flags, "
                        r"torchrun, slurm"),
    ({"master_addr": ""}, r"master address '' is not a host name or address"),
    ({"master_addr": "node 0"}, r"master address 'node 0' is not a host name"),
    ({"master_addr": "node0\n"}, r"master address 'node0\\n' is not"),
])
def test_a_bad_role_is_refused_naming_the_value(kwargs, match):
    with pytest.raises(ClusterError, match=match) as info:
        NodeRole(**kwargs)
    assert "\n" not in str(info.value)


def test_the_role_is_frozen():
    with pytest.raises(AttributeError):
        NodeRole().node_rank = 1  # type: ignore[misc]


# -- resolve_role: nothing given

@pytest.mark.parametrize("env", [{}, {"MASTER_ADDR": "h"}, {"GROUP_RANK": "0"},
                                 {"SLURM_NODEID": "0"}, {"SLURM_NNODES": "2"},
                                 {"WORLD_SIZE": "4", "RANK": "1"}])
def test_without_flags_or_a_full_launcher_env_the_run_is_single(env):
    assert resolve_role(NO_FLAGS, env) == NodeRole()
    assert resolve_role({}, env) == NodeRole()


def test_a_single_run_keeps_nproc_per_node():
    assert resolve_role(_flags(nproc_per_node=3), {}) == NodeRole(nproc_per_node=3)


# -- resolve_role: by-hand flags

@settings(max_examples=60, deadline=None)
@given(nnodes=st.integers(2, 64), data=st.data(), port=st.integers(1, 65535),
       nproc=st.integers(1, 16))
def test_flags_give_the_role_they_name(nnodes, data, port, nproc):
    rank = data.draw(st.integers(0, nnodes - 1))
    role = resolve_role(_flags(nnodes=nnodes, node_rank=rank, master_addr="head.example",
                               master_port=port, nproc_per_node=nproc),
                        TORCHRUN | SLURM)  # flags win over any launcher's environment
    assert role == NodeRole(nnodes=nnodes, node_rank=rank, master_addr="head.example",
                            master_port=port, source="flags", nproc_per_node=nproc)


def test_flags_without_a_port_take_the_default_port():
    role = resolve_role(_flags(nnodes=2, node_rank=1, master_addr="10.1.2.3"), {})
    assert (role.master_port, role.master_addr, role.source) == (DEFAULT_PORT, "10.1.2.3",
                                                                 "flags")
    assert not role.use_agent_store and role.store_prefix == "gasloc"


def test_one_node_by_flags_needs_nothing_else():
    role = resolve_role(_flags(nnodes=1), {})
    assert role == NodeRole(source="flags")
    role = resolve_role(_flags(node_rank=0), {})
    assert role == NodeRole(source="flags")


@pytest.mark.parametrize(("given_flags", "missing"), [
    ({"nnodes": 2}, "--node-rank, --master-addr"),
    ({"nnodes": 2, "node_rank": 1}, "--master-addr"),
    ({"nnodes": 3, "master_addr": "h"}, "--node-rank"),
    ({"nnodes": 2, "node_rank": 0, "master_port": 29500}, "--master-addr"),
])
def test_a_multi_node_run_by_flags_names_the_missing_flags(given_flags, missing):
    with pytest.raises(ClusterError, match=f"a multi-node run needs {missing} as well$"):
        resolve_role(_flags(**given_flags), {})


def test_a_node_rank_without_nnodes_is_out_of_range():
    with pytest.raises(ClusterError, match=r"node_rank = 1 is out of range; .* \[0, 0\]"):
        resolve_role(_flags(node_rank=1, master_addr="h"), {})


def test_a_node_rank_past_nnodes_by_flags_is_refused():
    with pytest.raises(ClusterError, match=r"node_rank = 2 is out of range; .* \[0, 1\]"):
        resolve_role(_flags(nnodes=2, node_rank=2, master_addr="h"), {})


# -- resolve_role: torchrun

def test_torchrun_env_gives_the_role_with_the_agent_store_and_attempt_prefix():
    role = resolve_role(NO_FLAGS, TORCHRUN)
    assert role == NodeRole(nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500,
                            source="torchrun", use_agent_store=True,
                            store_prefix="gasloc/attempt_2")
    assert role.multi and not role.is_master


@pytest.mark.parametrize(("value", "agent"), [("True", True), ("true", True), ("TRUE", True),
                                              ("False", False), ("1", False), ("", False)])
def test_torchrun_agent_store_only_when_it_says_true(value, agent):
    assert resolve_role(NO_FLAGS, TORCHRUN | {"TORCHELASTIC_USE_AGENT_STORE": value}) \
        .use_agent_store is agent


def test_torchrun_defaults_attempt_0_no_agent_store_and_one_local_process():
    env = {k: v for k, v in TORCHRUN.items()
           if k not in ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
                        "LOCAL_WORLD_SIZE")}
    role = resolve_role(_flags(nproc_per_node=4), env)
    assert role.store_prefix == "gasloc/attempt_0" and not role.use_agent_store
    assert role.nproc_per_node == 4 and role.source == "torchrun"


@settings(max_examples=40, deadline=None)
@given(nnodes=st.integers(1, 128), data=st.data(), attempt=st.integers(0, 99))
def test_torchrun_without_group_world_size_counts_nodes_from_world_size(nnodes, data, attempt):
    rank = data.draw(st.integers(0, nnodes - 1))
    env = {k: v for k, v in TORCHRUN.items() if k != "GROUP_WORLD_SIZE"}
    env |= {"WORLD_SIZE": str(nnodes), "GROUP_RANK": str(rank),
            "TORCHELASTIC_RESTART_COUNT": str(attempt)}
    role = resolve_role(NO_FLAGS, env)
    assert (role.nnodes, role.node_rank, role.store_prefix) == \
        (nnodes, rank, f"gasloc/attempt_{attempt}")


def test_torchrun_wins_over_slurm():
    assert resolve_role(NO_FLAGS, SLURM | TORCHRUN).source == "torchrun"


@pytest.mark.parametrize("local", ["2", "8"])
def test_torchrun_with_several_processes_per_node_is_refused(local):
    with pytest.raises(ClusterError, match=f"torchrun started {local} processes on this node; "
                                           r"start one node agent per host \(--nproc-per-node 1"):
        resolve_role(NO_FLAGS, TORCHRUN | {"LOCAL_WORLD_SIZE": local})


@pytest.mark.parametrize(("change", "match"), [
    ({"GROUP_RANK": "one"}, "GROUP_RANK = 'one' in the environment is not an integer"),
    ({"MASTER_PORT": ""}, "MASTER_PORT = '' in the environment is not an integer"),
    ({"GROUP_WORLD_SIZE": "2.0"}, r"GROUP_WORLD_SIZE = '2\.0' in the environment is not an"),
    ({"LOCAL_WORLD_SIZE": "x"}, "LOCAL_WORLD_SIZE = 'x' in the environment is not an integer"),
    ({"GROUP_RANK": "2"}, r"node_rank = 2 is out of range; .* \[0, 1\]"),
    ({"MASTER_PORT": "70000"}, "master_port = 70000 is out of range"),
    ({"MASTER_ADDR": ""}, "master address '' is not a host name"),
])
def test_a_bad_torchrun_env_is_refused_naming_the_variable(change, match):
    with pytest.raises(ClusterError, match=match):
        resolve_role(NO_FLAGS, TORCHRUN | change)


@pytest.mark.parametrize("gone", ["MASTER_PORT", "GROUP_WORLD_SIZE"])
def test_torchrun_env_missing_a_variable_names_it(gone):
    env = {k: v for k, v in TORCHRUN.items() if k != gone}
    want = "WORLD_SIZE" if gone == "GROUP_WORLD_SIZE" else gone
    with pytest.raises(ClusterError, match=f"^{want} = None in the environment is not an"):
        resolve_role(NO_FLAGS, env)


# -- resolve_role: Slurm

def test_slurm_env_gives_the_role_with_first_host_and_job_port():
    role = resolve_role(NO_FLAGS, SLURM)
    assert role == NodeRole(nnodes=3, node_rank=1, master_addr="gpu03",
                            master_port=DEFAULT_PORT + 234, source="slurm")
    assert role.store_prefix == "gasloc" and not role.use_agent_store


@settings(max_examples=50, deadline=None)
@given(job=st.integers(0, 10**9))
def test_slurm_port_follows_the_job_id_and_stays_in_a_1000_port_window(job):
    port = resolve_role(NO_FLAGS, SLURM | {"SLURM_JOB_ID": str(job)}).master_port
    assert port == DEFAULT_PORT + job % 1000
    assert DEFAULT_PORT <= port < DEFAULT_PORT + 1000


def test_two_slurm_jobs_a_thousand_apart_share_a_port_but_neighbours_do_not():
    ports = [resolve_role(NO_FLAGS, SLURM | {"SLURM_JOB_ID": str(j)}).master_port
             for j in (5000, 5001, 6000)]
    assert ports == [DEFAULT_PORT, DEFAULT_PORT + 1, DEFAULT_PORT]


def test_slurm_master_addr_and_port_from_the_env_win():
    role = resolve_role(NO_FLAGS, SLURM | {"MASTER_ADDR": "head", "MASTER_PORT": "1234"})
    assert (role.master_addr, role.master_port, role.source) == ("head", 1234, "slurm")


def test_slurm_without_a_job_id_takes_the_default_port():
    env = {k: v for k, v in SLURM.items() if k != "SLURM_JOB_ID"}
    assert resolve_role(_flags(nproc_per_node=2), env).master_port == DEFAULT_PORT
    assert resolve_role(_flags(nproc_per_node=2), env).nproc_per_node == 2


@pytest.mark.parametrize(("change", "match"), [
    ({"SLURM_NODEID": "3"}, r"node_rank = 3 is out of range; .* \[0, 2\]"),
    ({"SLURM_NNODES": "three"}, "SLURM_NNODES = 'three' in the environment is not an integer"),
    ({"SLURM_JOB_ID": "12.3"}, r"SLURM_JOB_ID = '12\.3' in the environment is not an integer"),
    ({"MASTER_PORT": "p"}, "MASTER_PORT = 'p' in the environment is not an integer"),
    ({"SLURM_JOB_NODELIST": "[1-3]"}, r"SLURM_JOB_NODELIST = '\[1-3\]' names no host; set "
                                      "MASTER_ADDR"),
])
def test_a_bad_slurm_env_is_refused_naming_the_variable(change, match):
    with pytest.raises(ClusterError, match=match):
        resolve_role(NO_FLAGS, SLURM | change)


def test_slurm_without_a_node_list_needs_master_addr():
    env = {k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"}
    with pytest.raises(ClusterError, match="SLURM_JOB_NODELIST = '' names no host"):
        resolve_role(NO_FLAGS, env)
    assert resolve_role(NO_FLAGS, env | {"MASTER_ADDR": "h0"}).master_addr == "h0"


# -- slurm_first_host

@pytest.mark.parametrize(("nodelist", "first"), [
    ("gpu[03-05,9],cpu1", "gpu03"),
    ("node1", "node1"),
    ("node1,node2", "node1"),
    ("  node7 ", "node7"),
    ("a[9,1-3]", "a9"),
    ("rack-1-n[007-010]", "rack-1-n007"),
    ("nid[00001]", "nid00001"),
    ("host.example.org", "host.example.org"),
])
def test_slurm_first_host_examples(nodelist, first):
    assert slurm_first_host(nodelist) == first


@settings(max_examples=100, deadline=None)
@given(prefix=st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True),
       lo=st.integers(0, 500), span=st.integers(0, 20), width=st.integers(1, 5),
       rest=st.lists(st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True), max_size=3))
def test_slurm_first_host_is_the_low_end_of_the_first_range(prefix, lo, span, width, rest):
    first = f"{lo:0{width}d}"
    ranges = f"{first}-{lo + span:0{width}d}" if span else first
    nodelist = ",".join([f"{prefix}[{ranges},{lo + span + 3}]", *rest])
    assert slurm_first_host(nodelist) == prefix + first


@pytest.mark.parametrize(("nodelist", "match"), [
    ("", "SLURM_JOB_NODELIST = '' names no host; set MASTER_ADDR"),
    (",node1", "SLURM_JOB_NODELIST = ',node1' names no host"),
    ("[01-02]", r"SLURM_JOB_NODELIST = '\[01-02\]' names no host"),
    ("gpu[]", r"SLURM_JOB_NODELIST = 'gpu\[\]' has an empty range"),
    ("gpu[,3]", r"SLURM_JOB_NODELIST = 'gpu\[,3\]' has an empty range"),
])
def test_a_node_list_without_a_first_host_is_refused(nodelist, match):
    with pytest.raises(ClusterError, match=match):
        slurm_first_host(nodelist)


# -- the split of the workers

@settings(max_examples=200, deadline=None)
@given(workers=st.integers(1, 5000), nnodes=st.integers(1, 64))
def test_the_even_share_adds_up_and_the_first_nodes_take_the_rest(workers, nnodes):
    shares = [default_share(workers, nnodes, k, 0) for k in range(nnodes)]
    assert sum(shares) == workers
    assert max(shares) - min(shares) <= 1
    assert shares == sorted(shares, reverse=True)
    assert all(type(s) is int for s in shares)
    extra = workers % nnodes
    assert shares[:extra] == [workers // nnodes + 1] * extra


@pytest.mark.parametrize(("workers", "nnodes", "shares"), [
    (8, 2, [4, 4]), (7, 3, [3, 2, 2]), (5, 3, [2, 2, 1]), (2, 3, [1, 1, 0]), (1, 1, [1]),
])
def test_the_even_share_examples(workers, nnodes, shares):
    assert [default_share(workers, nnodes, k, 0) for k in range(nnodes)] == shares


@settings(max_examples=50, deadline=None)
@given(workers=st.integers(1, 100), nnodes=st.integers(1, 8), gpus=st.integers(1, 16))
def test_visible_gpus_set_the_share(workers, nnodes, gpus):
    assert {default_share(workers, nnodes, k, gpus) for k in range(nnodes)} == {gpus}


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(0, 50), max_size=20))
def test_blocks_number_the_workers_in_node_order(counts):
    out = blocks(counts)
    assert [len(r) for r in out] == counts
    assert [rank for r in out for rank in r] == list(range(sum(counts)))
    for k, r in enumerate(out):
        assert r.start == sum(counts[:k]) and r.step == 1


def test_blocks_example():
    assert blocks([2, 3, 1]) == [range(0, 2), range(2, 5), range(5, 6)]


@settings(max_examples=100, deadline=None)
@given(counts=st.lists(st.integers(1, 50), min_size=1, max_size=20))
def test_a_split_that_adds_up_passes(counts):
    check_split(counts, sum(counts))
    with pytest.raises(ClusterError, match=f"the nodes bring {sum(counts)} workers .* but "
                                           f"--workers is {sum(counts) + 1};"):
        check_split(counts, sum(counts) + 1)


@pytest.mark.parametrize(("counts", "workers", "match"), [
    ([2, 1], 4, r"the nodes bring 3 workers \(node 0: 2, node 1: 1\) but --workers is 4; set "
                r"--nproc-per-node on each host so they add up, each at least 1"),
    ([4, 0], 4, r"the nodes bring 4 workers \(node 0: 4, node 1: 0\) but --workers is 4"),
    ([3, 3], 4, r"the nodes bring 6 workers \(node 0: 3, node 1: 3\)"),
    ([5, -1], 4, r"the nodes bring 4 workers \(node 0: 5, node 1: -1\)"),
])
def test_a_split_that_does_not_add_up_names_each_node(counts, workers, match):
    with pytest.raises(ClusterError, match=match) as info:
        check_split(counts, workers)
    assert "\n" not in str(info.value)


# -- the shared secret

SECRET = "correct horse battery staple"


def _expected(raw: bytes) -> bytes:
    return hashlib.sha256(b"gasloc-emu run secret\0" + raw).digest()


def _secret_file(path, content: bytes, mode: int = 0o600) -> str:
    path.write_bytes(content)
    os.chmod(path, mode)
    return str(path)


def test_the_secret_from_the_env_is_32_bytes_and_the_same_each_time():
    key = load_secret(None, {SECRET_ENV: SECRET})
    assert len(key) == 32 and key == _expected(SECRET.encode())
    assert load_secret(None, {SECRET_ENV: SECRET}) == key
    assert load_secret(None, {SECRET_ENV: SECRET + "!"}) != key


@settings(max_examples=60, deadline=None)
@given(a=st.text(min_size=MIN_SECRET_BYTES, max_size=64).map(str.strip)
       .filter(lambda s: len(s.encode()) >= MIN_SECRET_BYTES),
       b=st.text(min_size=MIN_SECRET_BYTES, max_size=64).map(str.strip)
       .filter(lambda s: len(s.encode()) >= MIN_SECRET_BYTES))
def test_same_secret_same_key_different_secret_different_key(a, b):
    ka, kb = load_secret(None, {SECRET_ENV: a}), load_secret(None, {SECRET_ENV: b})
    assert len(ka) == len(kb) == 32
    assert (ka == kb) == (a == b)
    assert load_secret(None, {SECRET_ENV: f"  {a}\n"}) == ka  # surrounding space is dropped


def test_the_file_and_the_env_with_the_same_secret_give_the_same_key(tmp_path):
    path = _secret_file(tmp_path / "secret", SECRET.encode() + b"\n")
    assert load_secret(path, {}) == load_secret(None, {SECRET_ENV: SECRET})


def test_the_file_wins_over_the_env(tmp_path):
    path = _secret_file(tmp_path / "secret", b"0123456789abcdef0123")
    assert load_secret(path, {SECRET_ENV: SECRET}) == _expected(b"0123456789abcdef0123")


def test_a_hex_file_as_the_docs_make_it_is_accepted(tmp_path):
    content = b"".join(bytes(range(k, k + 30)).hex().encode() + b"\n" for k in (0, 30))
    path = _secret_file(tmp_path / "secret", content)
    assert load_secret(path, {}) == _expected(content.strip())


@pytest.mark.parametrize("mode", [0o400, 0o600, 0o640, 0o660, 0o700, 0o750])
def test_a_file_others_cannot_read_is_accepted(tmp_path, mode):
    path = _secret_file(tmp_path / "secret", SECRET.encode(), mode)
    assert load_secret(path, {}) == _expected(SECRET.encode())


@pytest.mark.parametrize("mode", [0o604, 0o644, 0o666, 0o744, 0o755, 0o777])
def test_a_world_readable_file_is_refused(tmp_path, mode):
    path = _secret_file(tmp_path / "secret", SECRET.encode(), mode)
    want = f"--secret-file {re.escape(repr(path))} is readable by every user; chmod o-r it"
    with pytest.raises(ClusterError, match=want):
        load_secret(path, {SECRET_ENV: SECRET})


def test_a_missing_file_is_refused_naming_it(tmp_path):
    path = str(tmp_path / "nope")
    want = f"--secret-file {re.escape(repr(path))}: No such file or directory$"
    with pytest.raises(ClusterError, match=want):
        load_secret(path, {SECRET_ENV: SECRET})


def test_a_directory_is_not_a_secret_file(tmp_path):
    os.chmod(tmp_path, 0o700)
    want = f"--secret-file {re.escape(repr(str(tmp_path)))}: Is a directory$"
    with pytest.raises(ClusterError, match=want):
        load_secret(str(tmp_path), {})


@pytest.mark.parametrize(("content", "n"), [(b"", 0), (b"short", 5),
                                            (b"  fifteen bytes!!  \n", 15),
                                            (b"x" * (MIN_SECRET_BYTES - 1), 15)])
def test_a_short_secret_file_is_refused_naming_its_length(tmp_path, content, n):
    path = _secret_file(tmp_path / "secret", content)
    with pytest.raises(ClusterError, match=f"the shared secret has {n} bytes; it needs at least "
                                           f"{MIN_SECRET_BYTES}$"):
        load_secret(path, {})


@settings(max_examples=40, deadline=None)
@given(secret=st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc", "Zs")),
                      max_size=MIN_SECRET_BYTES - 1))
def test_a_short_env_secret_is_refused(secret):
    if not secret:
        with pytest.raises(ClusterError, match=f"needs a shared secret: --secret-file .* or "
                                               f"{SECRET_ENV} in every node's environment"):
            load_secret(None, {SECRET_ENV: secret})
        return
    with pytest.raises(ClusterError, match=f"the shared secret has {len(secret)} bytes"):
        load_secret(None, {SECRET_ENV: secret})


def test_sixteen_bytes_are_enough_and_multibyte_characters_count_as_bytes():
    assert len(load_secret(None, {SECRET_ENV: "x" * MIN_SECRET_BYTES})) == 32
    assert len(load_secret(None, {SECRET_ENV: "é" * 8})) == 32  # 16 bytes in UTF-8
    with pytest.raises(ClusterError, match="has 14 bytes"):
        load_secret(None, {SECRET_ENV: "é" * 7})


@pytest.mark.parametrize("secret_file", [None, ""])
def test_no_secret_at_all_is_refused_saying_how_to_make_one(secret_file):
    with pytest.raises(ClusterError, match=f"a multi-node run needs a shared secret: "
                                           f"--secret-file PATH .* or {SECRET_ENV}") as info:
        load_secret(secret_file, {"OTHER": SECRET})
    assert "\n" not in str(info.value)


# -- addresses

def test_the_route_to_a_loopback_master_is_loopback(free_ports):
    port = free_ports(1)[0]
    assert route_address("127.0.0.1", port) == "127.0.0.1"
    assert route_address("localhost", port) in ("127.0.0.1", "::1")


def test_the_route_to_an_ipv6_loopback_master_is_ipv6_loopback():
    try:
        socket.getaddrinfo("::1", 1, type=socket.SOCK_DGRAM)
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.connect(("::1", 1))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    assert route_address("::1", 29400) == "::1"


def test_a_master_name_that_does_not_resolve_is_refused(monkeypatch):
    def fail(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(cluster.socket, "getaddrinfo", fail)
    with pytest.raises(ClusterError, match="master address 'head.invalid' does not resolve: "
                                           ".*Name or service not known"):
        route_address("head.invalid", 29400)


def test_a_master_that_cannot_be_routed_to_is_refused():
    # the broadcast address: a UDP socket without SO_BROADCAST may not connect to it
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("255.255.255.255", 29400))
    except OSError:
        pass
    else:
        pytest.skip("this kernel lets a UDP socket connect to the broadcast address")
    with pytest.raises(ClusterError, match=r"no route to the master 255\.255\.255\.255: "):
        route_address("255.255.255.255", 29400)


def test_a_secret_file_on_a_single_host_run_is_refused_not_ignored(tmp_path, monkeypatch):
    """A run on one host draws its own secret: a --secret-file there would be unused."""
    from click.testing import CliRunner

    from gasloc_emu.commands.cli import main
    for var in ("WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    path = _secret_file(tmp_path / "secret", b"s" * 64)
    res = CliRunner().invoke(main, ["run", "--secret-file", path, "-n", "2",
                                    "--out", str(tmp_path / "rec")])
    assert res.exit_code == 2, res.output
    assert f"--secret-file {path} is for runs on several hosts" in res.output
    assert not (tmp_path / "rec").exists()


def test_resume_on_a_host_without_its_folder_of_the_run_is_refused(tmp_path, monkeypatch):
    """``--resume RUN_DIR`` on node 1 looks for its own folder, ``RUN_DIR.node1``, with that
    host's config; a record without it (another host's disk, a run on one host) is refused."""
    from click.testing import CliRunner

    from gasloc_emu.commands.cli import main
    for var in ("WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "config.toml").write_text("")
    node = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1"]
    res = CliRunner().invoke(main, ["run", "--resume", str(rec), *node])
    assert res.exit_code == 2, res.output
    assert f"{rec}.node1 holds no run of node 1 (no config.toml)" in res.output
    res = CliRunner().invoke(main, ["run", "--resume", str(rec), "--dry-run", *node])
    assert res.exit_code == 2 and "drop --dry-run" in res.output, res.output
