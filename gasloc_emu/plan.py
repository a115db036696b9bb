"""The run plan: everything a run is, derived once from its config before anything runs.

``build_plan(cfg)`` resolves the algorithm (its class and settings), builds the gossip graph
(when the algorithm needs one), the compute models, the bandwidth profile's link plan and the
simulator's model of it, the scenario's world and the corpus, and checks them against each
other. Bad input (an unknown algorithm or setting, an impossible graph, a broken profile,
network settings that would not be applied, a model whose width does not split into its
heads, a corpus too small for the workers) fails here, before a run folder, a namespace or a
process exists. ``simulate``, ``run`` (the launcher and node agents, which hand it to every
worker serialised: ``handed``, ``received``), ``sweep``, the dashboard header and the summary
take the plan; nothing below it derives these from the config again. Checks only worth a
warning come back as text for the command layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from dataclasses import replace as replace_plan
from pathlib import Path
from typing import Any

from gasloc_emu import algorithms, topology
from gasloc_emu.algorithms import Algorithm, Resolved
from gasloc_emu.comm.codecs import Codec, make_codec
from gasloc_emu.config import Config, ConfigError
from gasloc_emu.config import replace as replace_setting
from gasloc_emu.netplan import (
    check_network,
    describe_link_model,
    dilate_link_plan,
    link_rates,
    placement_regions,
    resolve_time_scale,
    sim_link_model,
    used_pairs,
)
from gasloc_emu.scenario.faults import FaultTimeline, read_recorded
from gasloc_emu.scenario.world import World
from gasloc_emu.scenario.world import from_config as world_from_config
from gasloc_emu.topology import Topology
from gasloc_emu.training import compute
from gasloc_emu.training.compute import ComputePlan
from gasloc_emu.training.data import Corpus, build_corpus, vocab_of
from gasloc_emu.training.devices import simulator_device
from gasloc_emu.training.drivers import Drive, drive_of
from gasloc_emu.training.model import check_model
from gasloc_emu.training.recipe import check_recipe, schedule_for

DESCRIBED_LINKS_MAX = 65_536   # ``describe`` lists every directed link up to this many


@dataclass(frozen=True)
class RunPlan:
    """One run, resolved. ``topology``: the full gossip graph (None when the algorithm needs
    none, DiLoCo's ring); ``world``: what a scenario does in each round (None without one);
    ``link_plan``: netem's per-link rates of the bandwidth profile (empty when unshaped);
    ``link_model``: the simulator's model of the shaped links (None when unshaped);
    ``corpus``: None for a plan made only to describe a run (``data=False``); ``codec``: what
    messages are compressed with (``comm.codecs``), None for ``comm.codec = none``."""

    cfg: Config
    algorithm: Resolved
    topology: Topology | None
    compute: ComputePlan
    link_plan: Any
    link_model: Any
    world: World | None
    corpus: Corpus | None
    warnings: tuple[str, ...] = ()
    codec: Codec | None = None  # comm.codec's rule; None: messages are float32 values
    # run.time_scale resolved (netplan's "Time dilation"): K, 1.0 when undilated. ``link_plan``
    # is then what the shaper plays (rates / K, delays x K); ``asked_links`` the asked one,
    # which ``link_model`` times on the emulated clock; ``auto_scale``: what 'auto' measured
    time_scale: float = 1.0
    asked_links: Any = None
    auto_scale: Any = None

    @property
    def emulated_links(self) -> Any:
        """The link plan as asked (the emulated network), whatever K is."""
        return self.asked_links if self.asked_links is not None else self.link_plan

    def clock(self):
        """A worker's clock under this plan's time scale (``dilation.WorkerClock``)."""
        from gasloc_emu.netplan import WorkerClock
        return WorkerClock(self.time_scale)

    @property
    def algo(self) -> type[Algorithm]:
        """The algorithm's class: its traits (``algorithms.Algorithm``)."""
        return self.algorithm.cls

    @property
    def drive(self) -> Drive:
        """How the algorithm organises a worker's time (``training.drivers``)."""
        return drive_of(self.algo)

    @property
    def steps(self) -> tuple[int, ...] | None:
        """H_i per round when known before the run."""
        return self.compute.step_counts()

    def constants(self) -> dict[str, float]:
        """The outer constants the algorithm shows (gamma, eta), as numbers."""
        return self.algo.constants(self.cfg.algo, self.topology)

    def run_label(self) -> str:
        """The default run name's algorithm part (``Algorithm.run_label``)."""
        return self.algo.run_label(self.cfg.topology.name)

    @property
    def regions(self) -> tuple[str, ...]:
        """Each worker's region (``net.placement``, checked with the config); () without one."""
        return placement_regions(self.cfg.net.placement)

    def topology_label(self) -> str:
        """The graph's name as records and the header show it."""
        return self.cfg.topology.name if self.topology is not None else "ring-allreduce"

    def describe(self) -> dict:
        """What the settings make of the run, JSON-able (``gasloc-emu config --plan``): the
        algorithm and its constants, the graph, the compute, the codec, each directed link and
        the model ``simulate`` times it by, and what the scenario changes in which round."""
        topo = self.topology
        graph: dict[str, Any] = {"name": self.topology_label()}
        if topo is not None:
            graph |= {"lambda2": topo.lambda2, "spectral_gap": topo.spectral_gap,
                      "time_varying": topo.time_varying,
                      # a random graph's neighbours change every round: none to show
                      "neighbours": None if topo.time_varying else topo.neighbors(0),
                      "peers": topo.peers_record()}
        links = self.emulated_links
        shaped = links is not None and links.shaped
        # past DESCRIBED_LINKS_MAX directed links, the ones training uses (a row each of
        # 16.7 M at 4096 workers would take gigabytes to say what the profile's rule says)
        many = shaped and len(links.links) > DESCRIBED_LINKS_MAX
        pairs = used_pairs(self.cfg, topo) if many else None
        return {"algorithm": self.algorithm.record(), "constants": self.constants(),
                "topology": graph, "compute": self.compute.record(),
                "codec": self.codec.describe() if self.codec is not None else "none",
                "links": links.describe(pairs) if shaped else None,
                "link_model": describe_link_model(self.link_model),
                "time_scale": self.describe_time_scale(),
                "world": None if self.world is None else _describe_world(self.world)}

    def describe_time_scale(self) -> dict:
        """K and what it does (``describe``'s ``time_scale``; the record's plan): the asked
        setting, K, and under 'auto' the estimate it was picked from."""
        k = self.time_scale
        return {"asked": self.cfg.run.time_scale, "time_scale": k,
                "played_as": "as asked" if k == 1.0 else
                f"every rate / {k:g}, every delay, step time and timer x {k:g}; times "
                "reported are emulated (wall / K)",
                "auto": self.auto_scale.record() if self.auto_scale is not None else None}


def handed(plan: RunPlan) -> bytes:
    """The plan as the launcher hands it to its workers (through their zygote's pipe, never a
    network): serialised without the corpus, which each worker opens itself (``received``).

    cloudpickle, not pickle: a plan holds the functions its parts were built with (the world's
    peers, the links' models), which pickle could only carry as values if each were rewritten
    as a class; the bytes go only from a launcher to the processes it forks."""
    import cloudpickle
    return cloudpickle.dumps(replace_plan(plan, corpus=None))


def received(blob: bytes, cfg: Config) -> RunPlan:
    """A worker's run plan from its launcher's ``handed`` bytes, with the corpus opened here;
    the plan's config must be this run's (``cfg``, read from the record), else ``PlanError``."""
    import pickle
    plan = pickle.loads(blob)
    if not isinstance(plan, RunPlan) or plan.cfg != follow_tokenizer(cfg):
        raise PlanError("the plan handed by the launcher is not this run's (config.toml "
                        "differs): started from another run's zygote?")
    return replace_plan(plan, corpus=build_corpus(plan.cfg))


class PlanError(RuntimeError):
    """A worker was handed a plan that is not its run's."""


def _describe_world(world: World) -> dict:
    """What a scenario does, known before the run: who leaves and joins in which round, and
    every link change with its configured values (changes at a time land on a round only
    when the run gets there: their times are listed, their rounds are not)."""
    from gasloc_emu.scenario.events import as_record
    from gasloc_emu.scenario.observed import event_text, link_changes
    scenario = world.scenario
    trace = world.links.trace if world.links is not None else None
    return {"source": scenario.source if scenario is not None and scenario.events else None,
            "trace": getattr(trace, "source", None),
            "events": [event_text(as_record(ev)) for ev in scenario.events]
            if scenario is not None else [],
            "new_workers": sorted(scenario.newcomers) if scenario is not None else [],
            "membership": world.left_and_joined() if world.fixer is None else None,
            "link_changes": link_changes(world.links) if world.changes_links else []}


def build_plan(cfg: Config, corpus: Corpus | None = None, data: bool = True,
               faults: FaultTimeline | None = None) -> RunPlan:
    """Check ``cfg`` against everything a run needs and derive the run; raises the first
    bad-input error. ``corpus``: one already built for this config (tests share one);
    ``data=False``: no corpus (a plan to describe, not to train); ``faults``: a run record's
    random faults (faults.json), played instead of drawing the scenario's again."""
    cfg = follow_tokenizer(cfg)
    resolved = algorithms.resolve(cfg.algo)
    algo = resolved.cls
    link_plan = check_network(cfg)
    topo = topology.from_config(cfg, link_rates(link_plan)) if algo.needs_graph else None
    scale, auto = resolve_time_scale(cfg, link_plan, topo)   # K (netplan, "Time dilation")
    cp = compute.plan(cfg, algo.default_local_steps, algo.weights_by_steps(cfg.algo))
    check_model(cfg.model)
    check_recipe(cfg, simulator_device(cfg.run.device))  # run.device = cuda without a GPU
    world = world_from_config(cfg, topo, algo, link_plan, faults)  # every event checked
    _refuse(cfg, algo, topo, world is not None, world is not None and world.reshapes)
    codec = make_codec(cfg.comm.codec, cfg.comm.ratio, cfg.comm.block_size)
    _refuse_codec(cfg, algo, world)
    _refuse_checkpoints(cfg, algo, world)
    for h in cp.step_counts() or (None,):   # a schedule too short for its warmup, or unknown
        schedule_for(cfg.algo.inner, cfg.run.rounds if drive_of(algo).rounds_count_steps
                     else None if h is None else h * cfg.run.rounds)
    if corpus is None and data:
        corpus = build_corpus(cfg)
    played = dilate_link_plan(link_plan, scale)
    return RunPlan(cfg, resolved, topo, cp, played,
                   sim_link_model(cfg, link_plan, world, time_scale=scale),
                   world, corpus, algo.warnings(cfg, topo) if topo is not None else (), codec,
                   time_scale=scale, asked_links=None if played is link_plan else link_plan,
                   auto_scale=auto)


def recorded_faults(run_dir: str | Path) -> FaultTimeline | None:
    """A run record's random faults as drawn (faults.json), for ``build_plan``'s ``faults``
    when the run goes on (``--resume``); None without."""
    return read_recorded(run_dir)


def follow_tokenizer(cfg: Config) -> Config:
    """The model's vocabulary is the prepared corpus's (``data.path``, ``training.tokens``)
    where ``model.vocab_size`` is 0; a vocabulary set smaller than the tokenizer's is refused,
    a larger one (padded, as GPT-2's 50304) kept."""
    vocab = vocab_of(cfg.data)
    if vocab is None:
        return cfg
    if cfg.model.vocab_size == 0:
        return replace_setting(cfg, **{"model.vocab_size": vocab})
    if cfg.model.vocab_size < vocab:
        raise ConfigError(f"model.vocab_size = {cfg.model.vocab_size} is smaller than the "
                          f"tokenizer's {vocab} ids of data.path = {cfg.data.path!r}; set 0 "
                          "to follow the tokenizer")
    return cfg


def _refuse(cfg: Config, algo: type[Algorithm], topo: Topology | None,
            scenario: bool, reshapes: bool = False) -> None:
    """What the runners cannot do with this algorithm and these settings (exit 2).
    ``reshapes``: the scenario has leaves, joins or partitions."""
    if cfg.run.on_worker_loss == "continue" and (cfg.algo.overlap or not algo.supports.scenarios):
        # a host lost without warning is a leave at a round fixed as the run goes
        # (``scenario.hostloss``): the same refusals as a scenario's leaves, said so
        what = "algo.overlap = 1" if cfg.algo.overlap else f"algo.name = {algo.name}"
        raise ConfigError(f"run.on_worker_loss = 'continue' (going on after a lost host, whose "
                          f"workers leave at a round fixed as the run goes) cannot be used with "
                          f"{what}, which takes no leaves; use 'auto'")
    if cfg.algo.overlap and reshapes:
        # the runners' rule, whatever the algorithm: an overlapped exchange lands a round
        # late, on a graph (or ring) that a leave, join or partition may have changed since;
        # link, speed and pause events and link traces change only when messages arrive
        raise ConfigError("algo.overlap = 1 does not take leaves, joins or partitions: an "
                          "exchange lands a round after it was sent, when the graph it was "
                          "sent on may be gone; link, speed and pause events and link traces "
                          "are fine")
    refusal = algo.refusal(cfg, topo, scenario)
    if refusal:
        raise ConfigError(refusal)
    if cfg.sim.batched:
        _refuse_batched(cfg, algo, scenario)


def _refuse_checkpoints(cfg: Config, algo: type[Algorithm], world: World | None) -> None:
    """What a checkpointed run cannot take (``run.checkpoint_every``): a resumed run must be
    the same run, so every state it goes on from must be on disk and nothing in flight."""
    if cfg.run.checkpoint_every == 0:
        return
    reasons = (
        (not drive_of(algo).replays_exactly,
         f"{algo.name} pairs workers by the links' timing, which a resumed run cannot repeat"),
        (algo.checkpoint_state is None,
         f"{algo.name} does not declare the state it keeps between rounds (checkpoint_state)"),
        (bool(cfg.algo.overlap), "algo.overlap = 1 keeps an exchange in flight at every "
                                 "round's end"),
        (cfg.sim.batched, "sim.batched = true keeps the optimizers' state in the batch"))
    why = next((text for applies, text in reasons if applies), "")
    if why:
        raise ConfigError(f"run.checkpoint_every = {cfg.run.checkpoint_every} cannot be used: "
                          f"{why}; set run.checkpoint_every = 0")


def refuse_resume(plan: RunPlan, run_dir: str) -> None:
    """``--resume``: a run whose workers leave and join is not resumed (who must have a
    checkpoint of which round changes with the scenario; its checkpoints serve rejoins), nor
    one with events at a time (the rounds they fell on are the interrupted run's clock's)."""
    if plan.world is None:
        return
    if plan.world.armed:   # its checkpoints serve the workers of a lost host that comes back
        raise ConfigError(f"--resume {run_dir}: it went on after hosts lost without warning "
                          "(run.on_worker_loss = 'continue'), at rounds fixed on the "
                          "interrupted run's clock, which a resumed run cannot repeat; run it "
                          "again")
    if plan.world.churns:
        raise ConfigError(f"--resume {run_dir}: its scenario has workers leave or join, which "
                          "a resumed run cannot take up where it stopped; run it again")
    if plan.world.fixer is not None:
        raise ConfigError(f"--resume {run_dir}: its scenario has partitions at a time, fixed "
                          "at rounds on the interrupted run's clock, which a resumed run "
                          "cannot repeat; run it again")


def _refuse_codec(cfg: Config, algo: type[Algorithm], world: World | None) -> None:
    """A joiner has none of the public copies its edges' senders keep (``comm.channel``), so
    gossip with a lossy codec cannot take a join."""
    if cfg.comm.codec == "none" or not algo.compressed_kinds or world is None:
        return
    if world.joins:
        raise ConfigError(f"comm.codec = {cfg.comm.codec} cannot take a worker that joins with "
                          f"{algo.name}: its peers' public copies of the edge would not match "
                          "the joiner's; use comm.codec = none, or a scenario without joins")


def _refuse_batched(cfg: Config, algo: type[Algorithm], scenario: bool) -> None:
    """What the batched simulator cannot do: every worker must reach each round's inner phase
    with a step count known before it starts (``simulator.batched``)."""
    no_rounds = drive_of(algo).batched_refusal()
    reasons = ((no_rounds is not None, no_rounds or ""),
               (scenario, "a scenario or link trace changes who trains when"),
               (cfg.fault.worker >= 0, "an injected fault stops one worker alone"),
               (cfg.compute.inner_budget_s > 0 and cfg.compute.step_time_s == 0,
                "a budget filled with measured step times decides H_i during the run"))
    why = next((text for applies, text in reasons if applies), "")
    if why:
        raise ConfigError(f"sim.batched = true cannot simulate this run: {why}; set "
                          "sim.batched = false (the per-worker simulator)")
