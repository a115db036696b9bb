"""Which node of a multi-node run this process is, and how the workers split over the nodes.

Pure: everything is read from the flags and an environment mapping handed in, so each launch
form is a unit test. One node agent runs per host; three ways to start it give the same
``NodeRole`` (first match wins):

1. by hand, with torchrun's flag names: ``--nnodes 2 --node-rank K --master-addr HOST
   --master-port PORT`` on every host;
2. under torchrun (``--nproc-per-node 1``): ``GROUP_RANK``, ``GROUP_WORLD_SIZE`` (else
   ``WORLD_SIZE / LOCAL_WORLD_SIZE``), ``MASTER_ADDR``, ``MASTER_PORT``; with
   ``TORCHELASTIC_USE_AGENT_STORE=True`` the store already runs in torchrun's agent and every
   node joins it as a client, under a prefix per restart attempt, as torch.distributed does;
3. under Slurm (``srun --ntasks-per-node 1``): ``SLURM_NODEID``, ``SLURM_NNODES``, master = the
   first host of ``SLURM_JOB_NODELIST`` unless ``MASTER_ADDR`` is set; port ``MASTER_PORT`` or
   29400 + the job id mod 1000, so that two jobs on one node do not collide.

Workers are numbered in blocks per node: node 0 gets 0..k0-1, node 1 the next k1, and so on.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 29400           # torchrun's default rendezvous port
MIN_SECRET_BYTES = 16
SECRET_ENV = "GASLOC_SECRET"   # the user's shared secret, when no --secret-file is given
SOURCES = ("single", "flags", "torchrun", "slurm")


class ClusterError(ValueError):
    """A launch setting or environment that does not describe a valid multi-node run."""


@dataclass(frozen=True)
class NodeRole:
    """This process's place in the run; ``nnodes == 1`` is a single-host run."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    source: str = "single"          # how it was started: one of SOURCES
    use_agent_store: bool = False   # torchrun's agent hosts the store: join it as a client
    store_prefix: str = "gasloc"    # key prefix in the store (torchrun: per restart attempt)
    nproc_per_node: int = 0         # workers on this node; 0: GPUs visible, else an even share

    def __post_init__(self) -> None:
        _check_int("nnodes", self.nnodes, 1, 4096)
        _check_int("node_rank", self.node_rank, 0, self.nnodes - 1)
        _check_int("master_port", self.master_port, 1, 65535)
        _check_int("nproc_per_node", self.nproc_per_node, 0, 4096)
        if self.source not in SOURCES:
            raise ClusterError(f"source = {self.source!r} is not allowed; expected one of "
                               f"{', '.join(SOURCES)}")
        if not self.master_addr or any(c.isspace() for c in self.master_addr):
            raise ClusterError(f"master address {self.master_addr!r} is not a host name or "
                               "address")

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    @property
    def is_master(self) -> bool:
        """Whether this node hosts the store (unless torchrun's agent does) and the record."""
        return self.node_rank == 0


def _check_int(name: str, value, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ClusterError(f"{name} = {value!r} is out of range; expected an integer in "
                           f"[{lo}, {hi}]")


def resolve_role(flags: Mapping, env: Mapping[str, str]) -> NodeRole:
    """The role from explicit flags, else torchrun's environment, else Slurm's, else single.

    ``flags``: nnodes, node_rank, master_addr, master_port, nproc_per_node (None = not given).
    """
    nproc = flags.get("nproc_per_node") or 0
    if flags.get("nnodes") is not None or flags.get("node_rank") is not None:
        return _from_flags(flags, nproc)
    if "GROUP_RANK" in env and "MASTER_ADDR" in env:
        return _from_torchrun(env, nproc)
    if "SLURM_NODEID" in env and "SLURM_NNODES" in env:
        return _from_slurm(env, nproc)
    return NodeRole(nproc_per_node=nproc)


def _from_flags(flags: Mapping, nproc: int) -> NodeRole:
    missing = [f"--{k.replace('_', '-')}" for k in ("nnodes", "node_rank", "master_addr")
               if flags.get(k) is None]
    if missing and (flags.get("nnodes") or 1) > 1:
        raise ClusterError(f"a multi-node run needs {', '.join(missing)} as well")
    def given(key: str, default):
        return default if flags.get(key) is None else flags[key]
    return NodeRole(nnodes=given("nnodes", 1), node_rank=given("node_rank", 0),
                    master_addr=given("master_addr", "127.0.0.1"),
                    master_port=given("master_port", DEFAULT_PORT), source="flags",
                    nproc_per_node=nproc)


def _env_int(env: Mapping[str, str], name: str) -> int:
    """A non-negative integer written plainly (int() would also take "12_3" and " 5 ")."""
    value = env.get(name)
    if value is None or not re.fullmatch(r"[0-9]+", value):
        raise ClusterError(f"{name} = {value!r} in the environment is not an integer (plain "
                           "digits expected)")
    return int(value)


def _from_torchrun(env: Mapping[str, str], nproc: int) -> NodeRole:
    local = _env_int(env, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in env else 1
    if local != 1:
        raise ClusterError(f"torchrun started {local} processes on this node; start one node "
                           "agent per host (--nproc-per-node 1): the agent starts the workers")
    nnodes = (_env_int(env, "GROUP_WORLD_SIZE") if "GROUP_WORLD_SIZE" in env
              else _env_int(env, "WORLD_SIZE"))
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return NodeRole(nnodes=nnodes, node_rank=_env_int(env, "GROUP_RANK"),
                    master_addr=env["MASTER_ADDR"], master_port=_env_int(env, "MASTER_PORT"),
                    source="torchrun", use_agent_store=agent_store,
                    store_prefix=f"gasloc/attempt_{attempt}", nproc_per_node=nproc)


def _from_slurm(env: Mapping[str, str], nproc: int) -> NodeRole:
    master = env.get("MASTER_ADDR") or slurm_first_host(env.get("SLURM_JOB_NODELIST", ""))
    if "MASTER_PORT" in env:
        port = _env_int(env, "MASTER_PORT")
    else:
        port = DEFAULT_PORT + _env_int(env, "SLURM_JOB_ID") % 1000 if "SLURM_JOB_ID" in env \
            else DEFAULT_PORT
    return NodeRole(nnodes=_env_int(env, "SLURM_NNODES"), node_rank=_env_int(env, "SLURM_NODEID"),
                    master_addr=master, master_port=port, source="slurm", nproc_per_node=nproc)


_NODELIST_ITEM = re.compile(r"([^,\[]+)(\[[^\]]*\])?([^,\[]*)")


def slurm_first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu[03-05,9],cpu1`` -> ``gpu03``."""
    m = _NODELIST_ITEM.match(nodelist.strip())
    if m is None or not m.group(1):
        raise ClusterError(f"SLURM_JOB_NODELIST = {nodelist!r} names no host; set MASTER_ADDR")
    prefix, ranges, suffix = m.group(1), m.group(2), m.group(3)
    if not ranges:
        return prefix
    first = ranges[1:-1].split(",")[0].split("-")[0]
    if not first:
        raise ClusterError(f"SLURM_JOB_NODELIST = {nodelist!r} has an empty range")
    return prefix + first + suffix


# ---------------------------------------------------------------- the split of the workers

def default_share(workers: int, nnodes: int, node_rank: int, gpus: int) -> int:
    """Workers on one node when --nproc-per-node is not given: its visible GPUs, else an even
    share of --workers (the first ``workers % nnodes`` nodes take one more)."""
    if gpus > 0:
        return gpus
    return workers // nnodes + (node_rank < workers % nnodes)


def blocks(counts: list[int]) -> list[range]:
    """Each node's worker ranks, in blocks: node 0 gets 0..counts[0]-1, and so on."""
    out, start = [], 0
    for k in counts:
        out.append(range(start, start + k))
        start += k
    return out


def check_split(counts: list[int], workers: int) -> None:
    """The nodes' worker counts must add up to --workers, and every node needs one."""
    if sum(counts) != workers or min(counts) < 1:
        per = ", ".join(f"node {k}: {c}" for k, c in enumerate(counts))
        raise ClusterError(f"the nodes bring {sum(counts)} workers ({per}) but --workers is "
                           f"{workers}; set --nproc-per-node on each host so they add up, each "
                           "at least 1")


def resume_folder(run_dir: str, node_rank: int) -> Path:
    """This host's folder of the run that ``--resume RUN_DIR`` names: node 0's record itself;
    on node k, ``RUN_DIR`` when it is the ``.node<k>`` folder, else that folder beside it (one
    argument for every host where they share a filesystem)."""
    path = Path(run_dir)
    suffix = f".node{node_rank}"
    if node_rank == 0 or path.name.endswith(suffix):
        return path
    return path.with_name(path.name + suffix)


# ---------------------------------------------------------------- the shared secret

def load_secret(secret_file: str | None, env: Mapping[str, str]) -> bytes:
    """The run's 32-byte secret, the same on every node: SHA-256 of the secret file's content
    (e.g. on a shared filesystem), else of ``GASLOC_SECRET``. The store is never used: it is
    unauthenticated and unencrypted, and whoever reads the secret can join the run."""
    if secret_file:
        raw = _read_secret_file(Path(secret_file))
    elif env.get(SECRET_ENV):
        raw = env[SECRET_ENV].encode()
    else:
        raise ClusterError(f"a multi-node run needs a shared secret: --secret-file PATH (a file "
                           f"every host can read, e.g. made once with `python3 -c 'import "
                           f"secrets; print(secrets.token_hex(32))' > PATH; chmod 600 PATH`) "
                           f"or {SECRET_ENV} in every node's environment")
    raw = raw.strip()
    if len(raw) < MIN_SECRET_BYTES:
        raise ClusterError(f"the shared secret has {len(raw)} bytes; it needs at least "
                           f"{MIN_SECRET_BYTES}")
    return hashlib.sha256(b"gasloc-emu run secret\0" + raw).digest()


def _read_secret_file(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
        raw = path.read_bytes()
    except OSError as exc:
        raise ClusterError(f"--secret-file {str(path)!r}: {exc.strerror or exc}") from None
    if mode & 0o004:
        raise ClusterError(f"--secret-file {str(path)!r} is readable by every user; "
                           f"chmod o-r it (whoever reads it can join the run)")
    return raw


# ---------------------------------------------------------------- addresses

def route_address(master_addr: str, master_port: int) -> str:
    """This host's address on the route to the master: the one other nodes can reach here
    when they can reach the master (no packet is sent: a UDP connect only picks the route)."""
    try:
        infos = socket.getaddrinfo(master_addr, master_port, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise ClusterError(f"master address {master_addr!r} does not resolve: {exc}") from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(sockaddr)
        except OSError as exc:
            raise ClusterError(f"no route to the master {master_addr}: {exc}") from None
        return s.getsockname()[0]


def host_name() -> str:
    return os.uname().nodename
