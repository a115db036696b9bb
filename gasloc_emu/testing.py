"""The contract kit: what every outer algorithm, built in or brought as a plugin, must keep, as
functions a pytest test calls with the algorithm's name (docs/EXTENDING.md, "Check it").

    from gasloc_emu.testing import check_all

    def test_my_algorithm_keeps_the_contract(tmp_path):
        check_all("my-algo", tmp_path, **{"topology.name": "matching"})

``algo`` is what ``algo.name`` takes: a registered name or ``package.module:Class``. Extra
settings come as dotted keys (``**{"algo.params.fraction": 0.1}``, ``workers=4``) or as
``sets=["algo.params.fraction=0.1"]``, exactly as ``--set`` reads them. Every check runs the
tiny model on 4 workers for a few rounds, on the CPU, with a nominal step time (so nothing
depends on how fast this host is), and shares one small corpus per data setting within the
process. A broken contract is an ``AssertionError`` (``ContractError``) that says what differs.

The checks and why each matters:

- ``check_run_equals_simulate``: the multi-process emulator (``launch``, ZeroMQ) and the
  in-process simulator give the same losses. Everything this project reports from ``simulate``
  stands for ``run`` only while this holds; it breaks when an algorithm depends on thread or
  message timing, or sends something the emulator's receivers drop.
- ``check_deterministic``: the same seed gives the same bits twice (final loss, every worker's
  parameters, every row's training loss): comparisons between runs mean something only then.
- ``check_wire_kinds``: every message it sends has a kind and shape that its
  ``wire_kinds(numel, params)`` declares (besides gossip's ``z``, the ring's ``rs<s>``/``ag<s>``
  and the join's ``join``).
  The emulator's receivers allow exactly these and drop anything else, so an undeclared
  message hangs ``run`` while ``simulate`` goes through.
- ``check_state_bytes``: ``state_bytes()`` is honest: it counts at least every model-sized
  tensor the algorithm holds between rounds and no more than all of them. Memory reports and
  the choice of a GPU rest on it.
- ``check_churn``: when a worker leaves and joins (a scenario), either the run finishes with
  the joiner starting from its donor's parameters and taking over exactly what the donor
  handed over (``handover``/``take_over``), or the plan refuses it up front with a one-line
  reason (a ``ConfigError``), never a hang or a crash mid-run.
"""
from __future__ import annotations

import contextlib
import json
import math
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from gasloc_emu import config as C
from gasloc_emu.algorithms import Algorithm, registry
from gasloc_emu.config import ConfigError
from gasloc_emu.emulator.launcher import launch
from gasloc_emu.plan import RunPlan, build_plan
from gasloc_emu.report.records import new_run_dir
from gasloc_emu.simulator.simulate import simulate
from gasloc_emu.topology import LivingGraph, Topology
from gasloc_emu.training import worker as worker_mod
from gasloc_emu.training.data import Corpus, build_corpus
from gasloc_emu.training.model import count_parameters, shape_from_config
from gasloc_emu.training.worker import ring_members
from gasloc_emu.transport.base import TransportBase
from gasloc_emu.transport.schema import WireSchema

__all__ = ["BASE", "ContractError", "ContractReport", "check_all", "check_churn",
           "check_deterministic", "check_run_equals_simulate", "check_state_bytes",
           "check_wire_kinds", "contract_config", "declared_wire_kinds", "held_tensors",
           "observed_simulate"]

# What every check runs, unless the caller's settings say otherwise: small and host-independent.
BASE: dict[str, Any] = {
    "workers": 4, "seed": 0, "model.preset": "tiny", "run.rounds": 3, "run.dashboard": "off",
    "run.device": "cpu", "data.eval_batches": 2, "data.max_corpus_mb": 0.5,
    "compute.step_time_s": 0.01, "run.failure_detect_s": 0.05,
}
LOCAL_STEPS = 2      # H when the caller gives none (the algorithm's default when smaller)
TOLERANCE = 1e-5     # run against simulate: final eval loss, absolute
MODEL_SIZED = 0.01   # a held tensor of at least this share of the model's bytes is model-sized
WIRE_DTYPE = torch.float32   # what the emulator's transport carries

# A worker leaves at round 1 and comes back at round 3 of 4 (from a donor the world picks).
CHURN_ROUNDS = 4
CHURN_WORKER = 3
CHURN = f"""
[[event]]
type = "leave"
round = 1
worker = {CHURN_WORKER}

[[event]]
type = "join"
round = 3
worker = {CHURN_WORKER}
"""


class ContractError(AssertionError):
    """An algorithm breaks the contract; the message says which part and what differs."""


# ------------------------------------------------------------------------- configs and plans

def contract_config(algo: str, *, sets: Iterable[str] = (), **overrides: Any) -> C.Config:
    """The config a check runs: ``BASE``, ``algo.name = algo``, H = 2 (or the algorithm's
    default when smaller, e.g. dsgd's 1) unless given, then ``overrides`` (dotted keys), then
    ``sets`` (``KEY=VALUE`` items as ``--set`` reads them)."""
    tree = dict(BASE) | {"algo.name": algo} | overrides
    given = set(overrides) | {item.partition("=")[0].strip() for item in sets}
    if "algo.local_steps" not in given:
        default = registry.load(algo).default_local_steps
        tree["algo.local_steps"] = min(LOCAL_STEPS, default)
    return C.resolve(overrides=tree, sets=list(sets))


_corpora: dict[tuple, Corpus] = {}
_corpora_lock = threading.Lock()


def shared_corpus(cfg: C.Config) -> Corpus:
    """One corpus per data setting, model shape, worker count and seed in this process: every
    check (and every algorithm) with the same data trains on the same tokens, built once."""
    shape = shape_from_config(cfg.model)
    key = (cfg.data, shape.block_size, shape.vocab_size, cfg.workers, cfg.seed)
    with _corpora_lock:
        if key not in _corpora:
            _corpora[key] = build_corpus(cfg)
        return _corpora[key]


def _plan(cfg: C.Config) -> RunPlan:
    return build_plan(cfg, corpus=shared_corpus(cfg))


def declared_wire_kinds(plan: RunPlan, numel: int) -> dict[str, tuple[int, ...]]:
    """The kinds the emulator's receivers allow besides z, join and the ring's, asked as the
    worker processes ask them: for this model size and the algorithm's validated settings."""
    return plan.algo.wire_kinds(numel, plan.algorithm.params)


# ------------------------------------------------------------------ observing a simulation

@dataclass
class Sent:
    """One message as an algorithm handed it to its transport."""

    src: int
    dst: int
    round: int
    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Observed:
    """What ``observed_simulate`` saw: the summary and metrics rows, every worker object ever
    made (in order; a joiner's is a new one), every message sent, every ``state_bytes``
    mismatch between rounds, and each join (joiner, round, donor) with what the joiner had
    right after it against what its donor gave."""

    summary: dict
    rows: list[dict]
    workers: list = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)
    state_problems: list[str] = field(default_factory=list)
    joins: list[dict] = field(default_factory=list)

    def final_workers(self) -> list:
        """The last worker object of each rank, by rank."""
        last = {}
        for w in self.workers:
            last[w.rank] = w
        return [last[r] for r in sorted(last)]


@contextlib.contextmanager
def _observing(obs: Observed, model_bytes: int) -> Iterator[None]:
    """Patch the worker and the transport base class to record into ``obs`` while inside."""
    Worker = worker_mod.Worker
    orig_init, orig_round = Worker.__init__, Worker.run_round
    orig_donate, orig_join = Worker.donate, Worker.join
    orig_send = TransportBase.send
    donated: dict[tuple[int, int], dict] = {}

    def init(self, *a, **kw):
        orig_init(self, *a, **kw)
        obs.workers.append(self)

    def run_round(self, round_idx, *a, **kw):
        stats = orig_round(self, round_idx, *a, **kw)
        problem = _state_problem(self.algo, self.theta, model_bytes)
        if problem:
            obs.state_problems.append(f"worker {self.rank} after round {round_idx}: {problem}")
        return stats

    def send(self, peer, round_idx, kind, tensor, raw_nbytes=None):
        obs.sent.append(Sent(self.rank, peer, round_idx, kind, tuple(tensor.shape),
                             tensor.dtype))
        return orig_send(self, peer, round_idx, kind, tensor, raw_nbytes)

    def donate(self, joiner, round_idx):
        donated[(joiner, round_idx)] = {
            "donor": self.rank, "theta": self.theta.detach().clone(),
            "handover": {k: v.detach().clone() for k, v in self.algo.handover().items()}}
        return orig_donate(self, joiner, round_idx)

    def join(self, donor, round_idx):
        orig_join(self, donor, round_idx)
        gave = donated.get((self.rank, round_idx))
        obs.joins.append({
            "joiner": self.rank, "round": round_idx, "donor": donor, "gave": gave,
            "theta": self.theta.detach().clone(),
            "took": {k: v.detach().clone() for k, v in self.algo.handover().items()}})

    with mock.patch.object(Worker, "__init__", init), \
            mock.patch.object(Worker, "run_round", run_round), \
            mock.patch.object(Worker, "donate", donate), \
            mock.patch.object(Worker, "join", join), \
            mock.patch.object(TransportBase, "send", send):
        yield


def observed_simulate(plan: RunPlan, out: str | Path) -> Observed:
    """``simulate(plan, out)`` with every worker, message, between-round state and join
    recorded; the summary must say ``ok``."""
    obs = Observed({}, [])
    numel = count_parameters(plan.cfg.model)
    with _observing(obs, numel * WIRE_DTYPE.itemsize):
        obs.summary = simulate(plan, out)
    obs.rows = _rows(Path(out))
    if obs.summary.get("status") != "ok":
        raise ContractError(f"{plan.cfg.algo.name}: simulate ended {obs.summary.get('status')}: "
                            f"{obs.summary.get('error')}")
    return obs


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _losses(rows: list[dict]) -> dict[tuple[int, int], float]:
    return {(r["worker"], r["round"]): r["train_loss"] for r in rows}


# ------------------------------------------------------------------------------- the checks

def check_run_equals_simulate(algo: str, tmp_path, *, sets: Iterable[str] = (),
                              tol: float = TOLERANCE, **overrides: Any) -> tuple[dict, dict]:
    """(a) The emulator (``launch``: one process per worker, ZeroMQ on loopback) and the
    simulator give the same final eval loss (within ``tol``) and, for round-based algorithms,
    the same training loss in every (worker, round) row and the same bytes sent. An
    asynchronous algorithm (``driver = "pairwise"``) pairs by message arrival in ``run``, so
    there both must finish with every worker's steps and the loss below ln(vocab), no more.
    Returns (run summary, simulate summary)."""
    cfg = contract_config(algo, sets=sets, **overrides)
    tmp = Path(tmp_path)
    plan = _plan(cfg)
    sim = observed_simulate(plan, tmp / "contract-simulate").summary
    ran = _launch(plan, tmp / "contract-run")
    _compare_run(plan, ran, sim, tmp / "contract-run", tmp / "contract-simulate", tol)
    return ran, sim


def _launch(plan: RunPlan, out: Path) -> dict:
    said: list[str] = []
    result = launch(plan, new_run_dir(plan.cfg, out, overwrite=True), log=said.append)
    summary = result.summary or _summary(out)
    if result.code != 0 or summary.get("status") != "ok":
        raise ContractError(f"{plan.cfg.algo.name}: run exited {result.code} "
                            f"({summary.get('status')}): {summary.get('error')}; "
                            f"launcher said: {' | '.join(said)[-2000:]}")
    return summary


def _summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _compare_run(plan: RunPlan, ran: dict, sim: dict, run_dir: Path, sim_dir: Path,
                 tol: float) -> None:
    name = plan.cfg.algo.name
    if ran.get("algorithm_source") != sim.get("algorithm_source"):
        raise ContractError(f"{name}: run records algorithm {ran.get('algorithm_source')}, "
                            f"simulate {sim.get('algorithm_source')}")
    if ran.get("drops", {}).get("total", 0):
        raise ContractError(f"{name}: run's receivers dropped messages: {ran['drops']} "
                            "(an undeclared kind or shape? see check_wire_kinds)")
    if not plan.drive.replays_exactly:
        _compare_async(plan, ran, sim, run_dir, sim_dir)
        return
    a, b = ran["final_eval_loss"], sim["final_eval_loss"]
    if not (math.isfinite(a) and abs(a - b) <= tol):
        raise ContractError(f"{name}: final eval loss {a!r} in run, {b!r} in simulate "
                            f"(allowed difference {tol})")
    got, want = _losses(_rows(run_dir)), _losses(_rows(sim_dir))
    if set(got) != set(want):
        raise ContractError(f"{name}: run has rows {sorted(set(got) ^ set(want))[:8]} "
                            "that simulate has not, or the other way round")
    worst = max((abs(got[k] - want[k]) / max(abs(want[k]), 1e-12), k) for k in want)
    if worst[0] > tol:
        raise ContractError(f"{name}: training loss of (worker, round) {worst[1]} is "
                            f"{got[worst[1]]!r} in run, {want[worst[1]]!r} in simulate")
    if ran.get("bytes_sent_total") != sim.get("bytes_sent_total"):
        raise ContractError(f"{name}: run sent {ran.get('bytes_sent_total')} bytes, simulate "
                            f"{sim.get('bytes_sent_total')}")


def _compare_async(plan: RunPlan, ran: dict, sim: dict, run_dir: Path, sim_dir: Path) -> None:
    name, cfg = plan.cfg.algo.name, plan.cfg
    ceiling = math.log(shape_from_config(cfg.model).vocab_size)
    for mode, summary, where in (("run", ran, run_dir), ("simulate", sim, sim_dir)):
        loss = summary["final_eval_loss"]
        if not (math.isfinite(loss) and loss < ceiling):
            raise ContractError(f"{name}: {mode}'s final eval loss {loss!r} is not below "
                                f"ln(vocab) = {ceiling:.3f}")
        steps = {(r["worker"], r["round"]) for r in _rows(where)}
        want = {(w, k) for w in range(cfg.workers) for k in range(cfg.run.rounds)}
        if steps != want:
            raise ContractError(f"{name}: {mode} recorded steps {sorted(steps ^ want)[:8]} "
                                "that it should not have, or missed them")


def check_deterministic(algo: str, tmp_path, *, sets: Iterable[str] = (),
                        **overrides: Any) -> Observed:
    """(b) Simulating the same config twice gives the same bits: the final eval loss, every
    worker's final parameters and every row's training loss are equal, not merely close.
    Returns the first simulation's observation."""
    cfg = contract_config(algo, sets=sets, **overrides)
    tmp = Path(tmp_path)
    first = observed_simulate(_plan(cfg), tmp / "contract-determinism-1")
    second = observed_simulate(_plan(cfg), tmp / "contract-determinism-2")
    _compare_twice(cfg.algo.name, first, second)
    return first


def _compare_twice(name: str, first: Observed, second: Observed) -> None:
    a, b = first.summary["final_eval_loss"], second.summary["final_eval_loss"]
    if a != b:
        raise ContractError(f"{name}: the same seed gave final eval loss {a!r}, then {b!r}")
    for wa, wb in zip(first.final_workers(), second.final_workers(), strict=True):
        if not torch.equal(wa.theta, wb.theta):
            diff = (wa.theta - wb.theta).abs().max().item()
            raise ContractError(f"{name}: the same seed gave worker {wa.rank} different "
                                f"parameters (largest difference {diff:.3g})")
    la, lb = _losses(first.rows), _losses(second.rows)
    if la != lb:
        k = next(k for k in sorted(set(la) | set(lb)) if la.get(k) != lb.get(k))
        raise ContractError(f"{name}: the same seed gave (worker, round) {k} training loss "
                            f"{la.get(k)!r}, then {lb.get(k)!r}")


def check_wire_kinds(algo: str, tmp_path, *, sets: Iterable[str] = (),
                     observed: Observed | None = None, **overrides: Any) -> dict[str, int]:
    """(c) Every message sent in a simulation passes the receiver's allow-list that ``run``
    builds (``WireSchema`` with ``wire_kinds(numel, params)`` as its extra kinds): its kind is
    z, join, a ring step or a declared kind, its shape the one declared, its dtype float32. A
    declared kind need not be sent in a plain run (DiLoCo's hand-over and heal messages are
    sent only with churn and partitions). Returns {kind: messages sent}."""
    cfg = contract_config(algo, sets=sets, **overrides)
    plan = _plan(cfg)
    obs = observed or observed_simulate(plan, Path(tmp_path) / "contract-wire")
    return _check_sent(plan, obs)


def _check_sent(plan: RunPlan, obs: Observed) -> dict[str, int]:
    cfg, name = plan.cfg, plan.cfg.algo.name
    numel = count_parameters(cfg.model)
    declared = declared_wire_kinds(plan, numel)
    try:
        schemas = {r: WireSchema(r, cfg.workers, numel, extra=declared,
                                 members=ring_members(plan.world, r))
                   for r in range(cfg.workers)}
    except ValueError as exc:
        raise ContractError(f"{name}: its wire_kinds {declared!r} is not a valid "
                            f"allow-list: {exc}") from None
    counts: dict[str, int] = {}
    for m in obs.sent:
        want = schemas[m.dst].shape_of(m.src, m.kind, m.round)
        if want is None:
            raise ContractError(f"{name}: worker {m.src} sent {m.kind!r} of round {m.round} to "
                                f"worker {m.dst}, which run's receiver drops: not z, join, a "
                                f"ring step, or a kind of its wire_kinds: {declared!r}")
        if m.shape != tuple(want):
            raise ContractError(f"{name}: worker {m.src} sent {m.kind!r} of shape "
                                f"{list(m.shape)} to worker {m.dst}; run's receiver allows only "
                                f"{list(want)}")
        if m.dtype != WIRE_DTYPE:
            raise ContractError(f"{name}: worker {m.src} sent {m.kind!r} as {m.dtype}; the "
                                f"emulator's transport carries {WIRE_DTYPE}")
        family = re.sub(r"^(rs|ag)\d+$", r"\1", m.kind)
        counts[family] = counts.get(family, 0) + 1
    return counts


def check_state_bytes(algo: str, tmp_path, *, sets: Iterable[str] = (),
                      observed: Observed | None = None, **overrides: Any) -> list[int]:
    """(d) After every round (and at the end) each worker's ``algo.state_bytes()`` lies
    between the bytes of the model-sized tensors its algorithm holds (attributes of the
    instance, inside lists, dicts and helper objects, not the worker's own parameters, each
    storage once) and the bytes of all the tensors it holds. Returns the final state_bytes
    per worker."""
    cfg = contract_config(algo, sets=sets, **overrides)
    plan = _plan(cfg)
    obs = observed or observed_simulate(plan, Path(tmp_path) / "contract-state")
    model_bytes = count_parameters(cfg.model) * WIRE_DTYPE.itemsize
    problems = list(obs.state_problems)
    for w in obs.final_workers():
        problem = _state_problem(w.algo, w.theta, model_bytes)
        if problem:
            problems.append(f"worker {w.rank} at the end: {problem}")
    if problems:
        raise ContractError(f"{cfg.algo.name}: state_bytes() is not what it holds: "
                            + "; ".join(problems[:4]))
    return [w.algo.state_bytes() for w in obs.final_workers()]


def held_tensors(algo: Algorithm, theta: torch.Tensor | None = None,
                 depth: int = 3) -> dict[str, torch.Tensor]:
    """{attribute path: tensor} of what ``algo`` holds: its attributes, searched through lists,
    tuples, dicts and plain helper objects (not transports, graphs, modules or functions) up
    to ``depth`` levels; one entry per storage, none sharing ``theta``'s storage."""
    skip = {_ptr(theta)} if theta is not None else set()
    out: dict[str, torch.Tensor] = {}

    def walk(obj: Any, path: str, level: int) -> None:
        if isinstance(obj, torch.Tensor):
            ptr = _ptr(obj)
            if obj.numel() and ptr not in skip:
                skip.add(ptr)
                out[path] = obj
            return
        if level >= depth or _opaque(obj):
            return
        if isinstance(obj, Mapping):
            items = ((f"{path}[{k!r}]", v) for k, v in obj.items())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
        elif hasattr(obj, "__dict__"):
            items = ((f"{path}.{k}", v) for k, v in vars(obj).items())
        else:
            return
        for sub, value in items:
            walk(value, sub, level + 1)

    for name, value in vars(algo).items():
        walk(value, name, 0)
    return out


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _opaque(obj: Any) -> bool:
    """What the state walk does not enter: transports, graphs, modules, callables, types."""
    return (isinstance(obj, (TransportBase, Topology, LivingGraph, torch.nn.Module, type,
                             str, bytes, int, float, bool))
            or callable(obj) or hasattr(obj, "send") and hasattr(obj, "recv"))


def _state_problem(algo: Algorithm, theta: torch.Tensor, model_bytes: int) -> str | None:
    held = held_tensors(algo, theta)
    sizes = {path: t.untyped_storage().nbytes() for path, t in held.items()}
    total = sum(sizes.values())
    big = sum(n for n in sizes.values() if n >= MODEL_SIZED * model_bytes)
    reported = algo.state_bytes()
    if big <= reported <= total:
        return None
    listing = ", ".join(f"{p} {n} B" for p, n in sizes.items()) or "no tensors"
    return (f"state_bytes() = {reported}, but it holds {listing} ({big} B model-sized, "
            f"{total} B in all)")


def check_churn(algo: str, tmp_path, *, sets: Iterable[str] = (),
                **overrides: Any) -> str:
    """(e) Worker 3 leaves at round 1 and joins again at round 3 of 4. Either the plan refuses
    the scenario with a one-line ``ConfigError`` (returns "refused: REASON"), or the simulation
    finishes ``ok`` with the departure and the join recorded, the joiner starting from exactly
    the parameters its donor sent and having taken over exactly what the donor handed over
    (``handover``/``take_over``: afterwards its own ``handover()`` equals the donor's), and
    every message, the hand-over's included, allowed by run's receivers (returns
    "took over: KINDS")."""
    tmp = Path(tmp_path)
    tmp.mkdir(parents=True, exist_ok=True)
    scenario = tmp / "contract-churn.toml"
    scenario.write_text(CHURN)
    overrides = {"run.rounds": CHURN_ROUNDS} | overrides
    plain = contract_config(algo, sets=sets, **overrides)
    _plan(plain)   # without the scenario the plan must stand: a refusal is the scenario's
    cfg = contract_config(algo, sets=sets,
                          **(overrides | {"run.scenario": str(scenario)}))
    try:
        plan = _plan(cfg)
    except ConfigError as exc:
        reason = str(exc)
        if not reason.strip() or "\n" in reason.strip():
            raise ContractError(f"{algo}: a scenario with churn is refused without a one-line "
                                f"reason: {reason!r}") from None
        return f"refused: {reason}"
    obs = observed_simulate(plan, tmp / "contract-churn")
    name = cfg.algo.name
    changes = obs.summary.get("membership", {}).get("changes")
    want = [{"type": "leave", "worker": CHURN_WORKER, "round": 1},
            {"type": "join", "worker": CHURN_WORKER, "round": 3}]
    if changes != want:
        raise ContractError(f"{name}: the record's membership changes are {changes}, "
                            f"expected {want}")
    if [(j["joiner"], j["round"]) for j in obs.joins] != [(CHURN_WORKER, 3)]:
        raise ContractError(f"{name}: expected one join of worker {CHURN_WORKER} at round 3, "
                            f"saw {[(j['joiner'], j['round']) for j in obs.joins]}")
    join = obs.joins[0]
    gave = join["gave"]
    if gave is None or gave["donor"] != join["donor"]:
        raise ContractError(f"{name}: worker {CHURN_WORKER} joined from worker "
                            f"{join['donor']}, which donated nothing to it")
    if not torch.equal(join["theta"], gave["theta"]):
        raise ContractError(f"{name}: the joiner's parameters differ from what its donor, "
                            f"worker {join['donor']}, sent")
    gave_h, took_h = gave["handover"], join["took"]
    if set(gave_h) != set(took_h) or not all(torch.equal(gave_h[k], took_h[k]) for k in gave_h):
        raise ContractError(f"{name}: the donor handed over {sorted(gave_h)}, but after "
                            f"take_over the joiner hands over {sorted(took_h)} with other "
                            "values: take_over did not take over")
    rows = _losses(obs.rows)
    if not all(math.isfinite(v) for v in rows.values()):
        raise ContractError(f"{name}: non-finite training losses with churn")
    _check_sent(plan, obs)
    return "took over: " + (", ".join(sorted(gave_h)) or "parameters only")


# ------------------------------------------------------------------------------- all of them

@dataclass
class ContractReport:
    """What ``check_all`` found, for a test to print or assert more on."""

    algo: str
    sent_kinds: dict[str, int]
    state_bytes: list[int]
    churn: str
    run: dict | None = None
    simulate: dict | None = None


def check_all(algo: str, tmp_path, *, emulator: bool = True, sets: Iterable[str] = (),
              **overrides: Any) -> ContractReport:
    """Every check, sharing runs where they can: one simulation is observed for (c) and (d)
    and compared with a second for (b) and with ``run`` for (a) (``emulator=False`` leaves
    the emulator out: it starts one process per worker, the slowest part), then (e)."""
    sets = list(sets)
    cfg = contract_config(algo, sets=sets, **overrides)
    tmp = Path(tmp_path)
    plan = _plan(cfg)
    first = observed_simulate(plan, tmp / "contract-simulate")
    second = observed_simulate(_plan(cfg), tmp / "contract-simulate-again")
    _compare_twice(cfg.algo.name, first, second)
    kinds = check_wire_kinds(algo, tmp, sets=sets, observed=first, **overrides)
    state = check_state_bytes(algo, tmp, sets=sets, observed=first, **overrides)
    report = ContractReport(cfg.algo.name, kinds, state, "", simulate=first.summary)
    if emulator:
        report.run = _launch(plan, tmp / "contract-run")
        _compare_run(plan, report.run, first.summary, tmp / "contract-run",
                     tmp / "contract-simulate", TOLERANCE)
    report.churn = check_churn(algo, tmp, sets=sets, **overrides)
    return report
