"""The run record's schemas: summary.json (``RunSummary``), one line of metrics.jsonl
(``MetricRow``) and one link of links.json (``LinkRow``), each a frozen dataclass whose fields
are the record's JSON keys, with a JSON round trip (``to_json`` / ``from_json``).

Versions: ``SCHEMA_VERSION`` is written into every summary, every metrics row and links.json.
A record without one was written before versions were (version 1: the same keys, no
``schema_version``) and reads as version 1; a version outside ``OLDEST_VERSION`` ..
``SCHEMA_VERSION`` is refused with one line naming it. A key a record lacks reads as its
field's default (None: "not recorded"); a key no field names is refused, so a producer that
adds a key adds a field here (and docs/RECORDS.md is rendered from these fields,
``render_records``).

What is written: a field holding None is left out, except where the record has the group the
field belongs to (``group`` in its metadata: the results of a run that finished, the network
of an emulator run, a link's probe); there a None is written as null, as it always was. So
``from_json(obj).to_json() == obj`` for every record this version writes, and for version 1's
with the version added.

Readers that index a record by its JSON keys (the dashboard, sweep data, tests) read it as a
read-only mapping (``record["key"]``, ``record.get``, ``in``); ``record | {key: value}`` is a
new record with those fields replaced, checked like the first.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

SCHEMA_VERSION = 4   # 4: links.json's tcp_model_message_s and training_message_s_median;
                     # 3: fidelity, time_scale, delay_faithful_measured and the status
                     # "degraded"; 2: schema_version written; 1: the records before it was
OLDEST_VERSION = 1
STATUSES = ("ok", "failed", "diverged", "stopped", "error", "degraded")
MODES = ("run", "simulate")


class SchemaError(ValueError):
    """A record that does not fit its schema: a version this code cannot read, an unknown key,
    a missing required key or a value of the wrong kind. The text names the record and the
    key."""


def doc(text: str, *, group: str | None = None, since: int = OLDEST_VERSION):
    """A field's metadata: ``text`` for docs/RECORDS.md, the ``group`` in whose records a None
    is written as null, the version that added the field."""
    return {"doc": text, "group": group, "since": since}


def opt(text: str, **kw):
    """An optional field: None (not recorded) by default."""
    return field(default=None, metadata=doc(text, **kw))


def req(text: str, **kw):
    """A required field: every record of this kind has it."""
    return field(metadata=doc(text, **kw))


def check_version(record: str, version) -> int:
    """``version`` when this code reads it; SchemaError naming it and the supported range."""
    if type(version) is not int or not OLDEST_VERSION <= version <= SCHEMA_VERSION:
        raise SchemaError(f"{record}: schema_version {version!r} is not supported; this "
                          f"gasloc-emu reads versions {OLDEST_VERSION} to {SCHEMA_VERSION}")
    return version


class _Record(Mapping):
    """What the three schemas share: the JSON round trip, the read-only mapping of JSON keys,
    ``|`` and ``replace`` for a record with some fields changed."""

    RECORD: ClassVar[str] = "record"           # the file it lives in, for errors
    GROUPS: ClassVar[dict[str, str]] = {}      # group -> the field whose value makes it present
    VERSIONED: ClassVar[bool] = True           # carries schema_version itself

    # -- the JSON
    def _written(self) -> dict[str, Any]:
        present = {g for g, anchor in self.GROUPS.items() if getattr(self, anchor) is not None}
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None or f.default is dataclasses.MISSING or \
                    f.metadata.get("group") in present:
                out[f.name] = value
        return out

    def to_json(self) -> dict:
        """The record as written: None left out outside its group (module docstring)."""
        return _jsonable(self._written())

    @classmethod
    def from_json(cls, obj, version: int | None = None):
        """The record in a decoded JSON object (``version``: the document's, for records that
        do not carry their own); SchemaError naming the key that does not fit."""
        if not isinstance(obj, Mapping):
            raise SchemaError(f"{cls.RECORD}: expected a JSON object, got {type(obj).__name__}")
        data = dict(obj)
        if cls.VERSIONED:
            version = data.pop("schema_version", OLDEST_VERSION)
        check_version(cls.RECORD, OLDEST_VERSION if version is None else version)
        return cls.of(data)

    @classmethod
    def of(cls, data: Mapping):
        """The record of these JSON keys, the current version; SchemaError for a key no field
        names or a required one missing."""
        names = {f.name for f in dataclasses.fields(cls)} - {"schema_version"}
        unknown = sorted(set(data) - names)
        if unknown:
            raise SchemaError(f"{cls.RECORD}: unknown key(s) {unknown}; known: "
                              f"{sorted(names)}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in data]
        if missing:
            raise SchemaError(f"{cls.RECORD}: missing required key(s) {missing}")
        return cls(**data)

    def replace(self, **changes):
        """This record with ``changes`` (JSON keys); unknown keys refused like ``of``'s."""
        return type(self).of({**self._fields(), **changes})

    def __or__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return self.replace(**dict(other))

    def _fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "schema_version"}

    def body(self) -> dict:
        """``to_json`` without ``schema_version``: the fields alone (the control plane's
        metric message carries a row's)."""
        out = self.to_json()
        out.pop("schema_version", None)
        return out

    # -- the read-only mapping of what is written
    def __getitem__(self, key: str):
        f = _field_map(type(self)).get(key)
        if f is None:
            raise KeyError(key)
        value = getattr(self, key)
        if value is None and f.default is not dataclasses.MISSING:
            group = f.metadata.get("group")
            anchor = self.GROUPS.get(group) if group is not None else None
            if anchor is None or getattr(self, anchor) is None:
                raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._written())

    def __len__(self) -> int:
        return len(self._written())

    def __eq__(self, other):
        """A record equals a mapping of the same keys and values, the version aside (as the
        dicts it replaces did)."""
        if isinstance(other, _Record):
            return type(self) is type(other) and self._fields() == other._fields()
        if not isinstance(other, Mapping):
            return NotImplemented
        mine = self._written()
        mine.pop("schema_version", None)
        return mine == {k: v for k, v in other.items() if k != "schema_version"}

    __hash__ = None  # mutable values (lists, dicts) inside


_FIELDS: dict[type, dict[str, dataclasses.Field]] = {}


def _field_map(cls: type) -> dict[str, dataclasses.Field]:
    if cls not in _FIELDS:
        _FIELDS[cls] = {f.name: f for f in dataclasses.fields(cls)}
    return _FIELDS[cls]


def _jsonable(obj):
    """JSON values: tuples as lists, int keys as text, non-finite floats as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _check(record: str, name: str, value, ok: bool, expected: str) -> None:
    if not ok:
        raise SchemaError(f"{record}: {name} = {value!r} is not {expected}")


def _is_int(v) -> bool:
    return type(v) is int


def _is_num(v) -> bool:
    return type(v) in (int, float)


# ---------------------------------------------------------------- summary.json

@dataclass(frozen=True, eq=False)
class RunSummary(_Record):
    """summary.json: how a run ended and the numbers it ended with. Every ending writes one;
    a run that did not finish has only the first fields (status, error, mode) and what it had
    counted by then."""

    RECORD: ClassVar[str] = "summary.json"
    GROUPS: ClassVar[dict[str, str]] = {"results": "algorithm", "network": "shaper"}

    status: str = req("how the run ended: ok, failed, diverged, stopped, error or degraded "
                      "(finished, but not faithful under run.require_faithful; README: exit "
                      "codes)")
    schema_version: int = field(default=SCHEMA_VERSION, metadata=doc(
        "the record's schema version (absent: 1, written before versions were)", since=2))
    error: str | None = opt("why the run did not finish, one line")
    diverged_at: dict | None = opt("a diverged run's first non-finite numbers: {worker, round}")
    mode: str | None = opt("run (the emulator) or simulate")
    # -- the results of a finished run (report.summary.final_summary)
    algorithm: str | None = opt("algo.name", group="results")
    algorithm_source: dict | None = opt(
        "where the algorithm's class comes from (name, object, package, version) and its "
        "settings as validated (params)", group="results")
    topology: str | None = opt("the graph's label (none for algorithms without one)",
                               group="results")
    workers: int | None = opt("worker count", group="results")
    rounds: int | None = opt("run.rounds (a2cid2: each worker's steps)", group="results")
    local_steps: list | None = opt("H_i per worker per round; null when a budget is filled "
                                   "with measured steps (see metrics.jsonl)", group="results")
    lambda2: float | None = opt("the mixing matrix's second eigenvalue; null without a graph",
                                group="results")
    peers: dict | None = opt("how the gossip peers were chosen: {rule, bottleneck_mbit (the "
                             "slowest edge a round may use, the slower direction; null when "
                             "unshaped), edge_count (of the graph, or of the base graph "
                             "matchings are drawn from), edges ([a, b, rate_mbit] of a fixed "
                             "graph of at most 4096 edges; null otherwise)}; absent without a "
                             "graph", since=2)
    gamma: float | None = opt("the outer momentum, where the algorithm shows it",
                              group="results")
    eta: float | None = opt("the outer learning rate, where the algorithm shows it",
                            group="results")
    final_eval_loss: float | None = opt("eval loss of the workers' average model (summed in "
                                        "rank order, evaluated on the CPU)", group="results")
    final_perplexity: float | None = opt(
        "exp(final_eval_loss): the average model's held-out perplexity per token of the "
        "corpus's tokenizer (per byte for byte tokens)", since=2)
    worker_eval_loss: list | None = opt("each worker's own eval loss, rank order",
                                        group="results")
    consensus_distance: float | None = opt("RMS distance of the workers to their average",
                                           group="results")
    bytes_sent_total: int | None = opt("bytes every worker put on the wire", group="results")
    wall_s: float | None = opt("seconds the run took on this host", group="results")
    predicted_wall_s: float | None = opt("the simulator's virtual clock at the end: its "
                                         "prediction of the wall-clock time (null otherwise)",
                                         group="results")
    losses: str | None = opt("'none (timing only)' for simulate --timing-only, whose record "
                             "has no loss (its metrics' train_loss is null); absent otherwise")
    cpu_slots: float | None = opt("the CPU slots the simulator shared among workers computing "
                                "at once (null where it predicts nothing)", group="results")
    drops: dict | None = opt("data-plane messages dropped: {total, by_reason, by_worker}",
                             group="results")
    control_drops: dict | None = opt("control messages the launcher dropped, by reason "
                                     "(zap.*: connections refused)", group="results")
    uncommitted: dict | None = opt("rounds whose outer step was not taken, a part of their "
                                   "ring All-Reduce lost with a dead worker (DiLoCo after a "
                                   "lost host): {total, by_worker: {rank: [rounds]}}; absent "
                                   "when none", since=2)
    compute: dict | None = opt("the compute model: profile, step_time_s, inner_budget_s, "
                               "speeds, steps_per_round, overruns", group="results")
    comm: dict | None = opt("the codec and the bytes on the wire against their float32 "
                            "size: {codec, bytes_sent_total, raw_bytes_sent_total, ratio}",
                            group="results")
    corpus: dict | None = opt("the corpus: source, train_tokens, val_tokens and, for a "
                              "prepared one (gasloc-emu data prepare), its folder, vocab_size "
                              "and tokenizer", since=2)
    # -- the emulator's
    dropped_messages: int | None = opt("data-plane messages the workers dropped (run)")
    host_cpu: dict | None = opt("shares of the host's CPU time during the run (user, system, "
                                "idle, steal, ...; run)")
    last_rounds: list | None = opt("each worker's last round, for a run that ended early")
    asynchronous: dict | None = opt("asynchronous gossip: requests, pairings, exchanges, the "
                                    "lanes' overlap and the algorithm's pairing constants")
    # -- a scenario's
    membership: dict | None = opt("who left and joined in which round, who is alive at the "
                                  "end, the fixings of events at a time, the random faults "
                                  "by kind and outcome (faults.json has each)")
    link_changes: list | None = opt("a scenario's link changes and the rates observed after "
                                    "each (run)")
    timed_events: dict | None = opt("events at a time: {fired, max_late_ms} (run)")
    # -- a resumed run's (--resume)
    resumed: dict | None = opt("where a resumed run went on from: {round, time_s} of its "
                               "checkpoint, and the checkpoint files refused on the way")
    # -- the network of an emulator run (emulator.network's describe_summary)
    shaper: str | None = opt("tc, userspace, none or a registered shaper's name",
                             group="network")
    shaper_reason: str | None = opt("why that shaper", group="network")
    bw_profile: str | None = opt("net.bw_profile (null: unshaped)", group="network")
    delay: str | None = opt("how latency reaches the packets: netem, packet-line or "
                            "release-queue")
    delay_faithful_to_tcp: bool | None = opt("whether TCP sees that delay: the delay mode's "
                                             "capability, false where the run measured the "
                                             "packet line late beyond its limit (fidelity)")
    delay_faithful_measured: bool | None = opt(
        "whether the packet line released frames within the fidelity limit (null: no packet "
        "line, or nothing measured)", since=3)
    fidelity: dict | None = opt(
        "the run's own verdict (report.fidelity): {version, fidelity: faithful|degraded, "
        "reasons: [{rule, text, numbers, link}], worst_link, thresholds, recorded}", since=3)
    time_scale: float | None = opt(
        "the run's time scale K (run.time_scale resolved): links played at rate / K and delay "
        "x K, wall_s reported as emulated seconds (wall / K)", since=3)
    netns_mode: str | None = opt("how the namespaces were made (userns or root)")
    profile: str | None = opt("the bandwidth profile's name and note")
    tcp: dict | None = opt("TCP per link as set and as the host has it")
    # -- several hosts (cluster.multinode)
    nodes: list | None = opt("each node: its rank, host, address and workers")
    launch: str | None = opt("how the nodes were started: flags, torchrun or slurm")
    security: str | None = opt("the control and data planes' security: curve or plain")
    nodes_not_confirmed: list | None = opt("nodes that did not confirm the end in time")

    def __post_init__(self):
        _check(self.RECORD, "status", self.status, self.status in STATUSES, f"one of {STATUSES}")
        check_version(self.RECORD, self.schema_version)
        _check(self.RECORD, "mode", self.mode, self.mode in (None, *MODES), f"one of {MODES}")
        for name in ("workers", "rounds", "bytes_sent_total", "dropped_messages"):
            v = getattr(self, name)
            _check(self.RECORD, name, v, v is None or (_is_int(v) and v >= 0), "an int >= 0")
        for name in ("wall_s", "predicted_wall_s", "cpu_slots"):
            v = getattr(self, name)
            _check(self.RECORD, name, v, v is None or (_is_num(v) and v >= 0), "a number >= 0")

    @classmethod
    def ended(cls, status: str, error: str, **more) -> RunSummary:
        """The summary of a run that did not finish: how, why, and what else is known."""
        return cls.of({"status": status, "error": error, **more})


# ---------------------------------------------------------------- metrics.jsonl

@dataclass(frozen=True, eq=False)
class MetricRow(_Record):
    """One line of metrics.jsonl: one worker's round (a2cid2: one slot of steps), as the worker
    reports it (``training.worker.RoundStats``) with the runner's clock. The same in ``run``
    and ``simulate``, but for ``dropped`` (no wire in the simulator)."""

    RECORD: ClassVar[str] = "metrics.jsonl"

    worker: int = req("the worker's rank")
    round: int = req("the round, from 0")
    step: int = req("inner steps so far")
    train_loss: float | None = req("the last inner step's training loss (null: simulate "
                                   "--timing-only, which trains nothing)")
    compute_s: float | None = req("emulated compute seconds of the inner phase (its speed and "
                                  "pacing included)")
    comm_s: float | None = req("seconds of the round spent communicating (null in a failed "
                               "simulation's last rows)")
    wait_s: float | None = req("seconds of it spent waiting for peers (null as comm_s)")
    bytes_sent: int = req("bytes sent this round")
    bytes_recv: int = req("bytes received this round")
    peers: list = req("the ranks exchanged with, in order")
    time_s: float | None = req("the run's clock at the end of the round, from its start "
                               "(virtual in the simulator; null as comm_s)")
    schema_version: int = field(default=SCHEMA_VERSION, metadata=doc(
        "the row's schema version (absent: 1)", since=2))
    dropped: int | None = opt("messages dropped so far (run)")
    steps: int | None = opt("inner steps this round (H_i; fewer for a slow worker under a "
                            "budget)")
    speed: float | None = opt("the worker's speed in (0, 1]")
    overruns: int | None = opt("steps whose real time exceeded their nominal time")
    overrun_ratio: float | None = opt("the round's worst real / nominal step time (0 when "
                                      "measured)")
    eval_loss: float | None = opt("the worker's eval loss, in evaluated rounds")
    tokens: int | None = opt("tokens trained on this round: steps * algo.inner.micro_batches * "
                             "data.batch_size * the context length", since=2)
    lr: float | None = opt("the inner lr of the round's last step, where algo.inner's schedule "
                           "moves it (absent: the constant algo.inner.lr)", since=2)
    recv_links: dict | None = opt("per source rank (text): {bytes, messages, transfer_s, "
                                  "sent_s} of this round's messages (run)")
    step_span_s: list | None = opt("a2cid2: the step's [start, end] on the run's clock")
    dead_peer: list | None = opt("[src, round, kind] of each message this worker did without "
                                 "since its last row, its sender lost with its host (run; "
                                 "what simulate --replay takes as lost)", since=2)
    exchange_spans_s: list | None = opt("a2cid2, a slot's last step: each exchange's "
                                        "[start, end]")
    uncommitted: bool | None = opt("true: the round's outer step was not taken, its ring "
                                   "All-Reduce missing a part lost with a dead worker (DiLoCo "
                                   "after a lost host; absent: taken)", since=2)

    def __post_init__(self):
        check_version(self.RECORD, self.schema_version)
        for name in ("worker", "round", "step", "bytes_sent", "bytes_recv"):
            v = getattr(self, name)
            _check(self.RECORD, name, v, _is_int(v) and v >= 0, "an int >= 0")
        _check(self.RECORD, "peers", self.peers, isinstance(self.peers, list), "a list of ranks")

    @classmethod
    def from_round(cls, stats: Mapping, **measured) -> MetricRow:
        """The row of a round's statistics (``RoundStats.as_dict()``) and what the runner
        measured around it (``time_s``, ``dropped``, its clock's ``comm_s``/``wait_s``)."""
        return cls.of({**stats, **measured})


# ---------------------------------------------------------------- links.json

@dataclass(frozen=True, eq=False)
class LinkRow(_Record):
    """One directed link of links.json's ``links``: the bytes training moved on it and, where
    known, its configured values, its probe before training and what it delivered during
    training. links.json carries the version (``schema_version`` beside ``links``)."""

    RECORD: ClassVar[str] = "links.json"
    GROUPS: ClassVar[dict[str, str]] = {"configured": "configured_mbit",
                                        "probe": "measured_mbit"}
    VERSIONED: ClassVar[bool] = False

    src: int = req("the sending rank")
    dst: int = req("the receiving rank")
    bytes: int = req("bytes training moved on it (a probe's own, for a probed link)")
    raw_bytes: int | None = opt("what they stood for as float32 values, before compression")
    configured_mbit: float | None = opt("the rate the plan gave it (null: unshaped)",
                                        group="configured")
    configured_latency_ms: float | None = opt("the latency the plan gave it")
    measured_mbit: float | None = opt("the probe's rate", group="probe")
    ratio: float | None = opt("measured / configured rate", group="probe")
    measured_latency_ms: float | None = opt("the probe's median latency", group="probe")
    latency_p90_ms: float | None = opt("the probe's 90th percentile latency", group="probe")
    ok: bool | None = opt("the probe met the targets (within 10 %)")
    sender: dict | None = opt("the sender's kernel account during the probe", group="probe")
    host_steal: float | None = opt("the hypervisor's share of CPU time during the probe",
                                   group="probe")
    tcp_training: dict | None = opt("the senders' TCP as sampled during training (tc runs)",
                                    group="configured")
    training_goodput_mbit: float | None = opt("bytes / summed transfer time of training's "
                                              "messages")
    training_messages: int | None = opt("messages measured")
    training_transfer_s: float | None = opt("their summed transfer time")
    training_message_s_median: float | None = opt(
        "the median over rounds of one of its messages' transfer time (metrics.jsonl's "
        "recv_links)", since=4)
    tcp_model_message_s: float | None = opt(
        "what simulate's TCP model says one of its messages takes over the asked link (the "
        "fidelity verdict's transfer rule holds training_transfer_s / training_messages to "
        "it)", since=4)
    busy_s: float | None = opt("simulate: seconds the virtual clock had the link carrying "
                               "bytes (its busy share: over the summary's predicted_wall_s)")

    def __post_init__(self):
        for name in ("src", "dst", "bytes"):
            v = getattr(self, name)
            _check(self.RECORD, name, v, _is_int(v) and v >= 0, "an int >= 0")

    @classmethod
    def moved(cls, src: int, dst: int, nbytes: int, raw_bytes: int,
              busy_s: float | None = None) -> LinkRow:
        """The bytes training moved on one link, and before compression (and the seconds the
        simulator's clock had it busy)."""
        return cls.of({"src": src, "dst": dst, "bytes": nbytes, "raw_bytes": raw_bytes}
                      | ({"busy_s": busy_s} if busy_s is not None else {}))


def links_document(doc_: Mapping) -> dict:
    """links.json as written: its rows checked as ``LinkRow``s, the version beside them."""
    out = dict(doc_)
    out.pop("schema_version", None)
    out["links"] = [(row if isinstance(row, LinkRow) else LinkRow.of(row)).to_json()
                    for row in doc_.get("links", [])]
    return {"schema_version": SCHEMA_VERSION, **out}


def read_links(doc_) -> list[LinkRow]:
    """The rows of a decoded links.json (a list of rows, or {links: [...]}, any version)."""
    if isinstance(doc_, list):
        return [LinkRow.from_json(row) for row in doc_]
    if not isinstance(doc_, Mapping):
        raise SchemaError(f"links.json: expected a JSON object, got {type(doc_).__name__}")
    version = check_version("links.json", doc_.get("schema_version", OLDEST_VERSION))
    return [LinkRow.from_json(row, version) for row in doc_.get("links", [])]


RECORDS = (RunSummary, MetricRow, LinkRow)


RECORDS = (RunSummary, MetricRow, LinkRow)


def render_records() -> str:
    """docs/RECORDS.md: one table per record, from the dataclasses' fields and their ``doc``
    metadata (a test keeps the file equal to this)."""
    out = ["# Run records", "",
           "What every run leaves under its folder, field by field. Generated from",
           "`gasloc_emu/report/schema.py` by `render_records`; "
           "`tests/unit/test_record_schema.py` fails when this page",
           "differs. A field marked optional is left out when not recorded.",
           f"This version writes `schema_version` {SCHEMA_VERSION} and reads versions "
           f"{OLDEST_VERSION} to {SCHEMA_VERSION}.", ""]
    for cls in RECORDS:
        out += [f"## {cls.RECORD} (`{cls.__name__}`)", "",
                " ".join((cls.__doc__ or "").split()), "",
                "| field | default | since | what it is |", "| --- | --- | --- | --- |"]
        for f in dataclasses.fields(cls):
            meta = f.metadata
            if f.default is not dataclasses.MISSING:
                default = "optional" if f.default is None else f"`{f.default!r}`"
            elif f.default_factory is not dataclasses.MISSING:
                default = f"`{f.default_factory()!r}`"
            else:
                default = "required"
            text = " ".join(str(meta.get("doc", "")).split()).replace("|", "\\|")
            out.append(f"| `{f.name}` | {default} | {meta.get('since', OLDEST_VERSION)} | "
                       f"{text} |")
        out.append("")
    from gasloc_emu.report import fidelity
    out += ["## summary.json's `fidelity` (`report.fidelity`)", "",
            *(fidelity.__doc__ or "").strip().splitlines(), "",
            f"Limits as this version applies them: lateness cap {fidelity.LATENESS_CAP_MS:g} ms, "
            f"share {fidelity.LATENESS_SHARE:g}; transfer slack {fidelity.TRANSFER_SLACK:g}; "
            f"rate share {fidelity.RATE_SHARE:g}; "
            f"min busy {fidelity.MIN_BUSY_MS:g} ms; compute slack {fidelity.COMPUTE_SLACK:g}.",
            "",
            "Under time dilation (`time_scale` K > 1) `wall_s` is emulated seconds: the "
            "launcher's wall-clock seconds divided by K.", ""]
    return "\n".join(out)
