"""simulate --timing-only: simulate's times, bytes and link busy seconds to the float without
training, and one-line refusals of what it does not time."""
from __future__ import annotations

import json

import pytest

from gasloc_emu import config as C
from gasloc_emu.config import ConfigError
from gasloc_emu.plan import build_plan
from gasloc_emu.simulator import timing
from gasloc_emu.simulator.simulate import simulate

BASE = {"workers": 8, "model.preset": "tiny", "run.rounds": 2, "algo.local_steps": 2,
        "compute.step_time_s": 0.05, "run.dashboard": "off"}
TIMED = ("time_s", "comm_s", "wait_s", "compute_s", "bytes_sent", "bytes_recv", "peers",
         "steps", "step", "speed", "tokens")


def _cfg(**more):
    return C.resolve(None, BASE | more)


def _rows(folder):
    return {(r["worker"], r["round"]): r
            for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())}


def _links(folder):
    return {(lk["src"], lk["dst"]): lk
            for lk in json.loads((folder / "links.json").read_text())["links"]}


@pytest.mark.parametrize("settings", [
    {"algo.name": "gasloc", "topology.name": "expander", "net.bw_profile": "skewed",
     "net.latency_ms": 20.0},                                   # TCP-aware link model
    {"algo.name": "gasloc", "topology.name": "ring", "net.bw_profile": "skewed",
     "algo.overlap": 1, "algo.alpha": 0.5, "compute.profile": "straggler"},
    {"algo.name": "dsgd", "algo.local_steps": 1, "topology.name": "exponential",
     "net.bw_profile": "uniform", "net.rate_mbit": 20.0, "comm.codec": "topk"},
    {"algo.name": "diloco", "net.bw_profile": "two-cluster", "comm.codec": "int8"},
], ids=["gasloc-expander-tcp", "gasloc-overlap-straggler", "dsgd-topk", "diloco-int8"])
def test_timing_only_equals_simulate_to_the_float(tmp_path, settings):
    _assert_timing_equals_simulate(tmp_path, settings)
    for row in _rows(tmp_path / "timed").values():
        assert row["train_loss"] is None and "eval_loss" not in row
    assert all(lk["busy_s"] > 0 for lk in _links(tmp_path / "timed").values())


def _assert_timing_equals_simulate(tmp_path, settings: dict):
    """Timing-only's rows (their timed fields), links and wall-clock are simulate's; both
    summaries."""
    full = simulate(build_plan(_cfg(**settings)), tmp_path / "full", device="cpu")
    timed = timing.simulate_timing(build_plan(_cfg(**settings), data=False), tmp_path / "timed")
    a, b = _rows(tmp_path / "full"), _rows(tmp_path / "timed")
    assert a.keys() == b.keys()
    for key, row in a.items():
        assert {f: row.get(f) for f in TIMED} == {f: b[key].get(f) for f in TIMED}, key
    assert _links(tmp_path / "full") == _links(tmp_path / "timed")
    assert timed.predicted_wall_s == full.predicted_wall_s
    return full, timed
    assert timed.bytes_sent_total == full.bytes_sent_total and timed.comm == full.comm
    assert timed.losses == "none (timing only)" and full.losses is None
    assert timed.final_eval_loss is None


@pytest.mark.parametrize("settings, names", [
    ({"compute.step_time_s": 0.0}, "compute.step_time_s"),
    ({"algo.name": "a2cid2"}, "algo.name = a2cid2"),
    ({"algo.name": "diloco", "algo.overlap": 1}, "algo.overlap = 1"),
    ({"run.checkpoint_every": 1}, "run.checkpoint_every"),
    ({"fault.worker": 2}, "fault.worker = 2"),
])
def test_timing_only_refuses_what_it_does_not_time(tmp_path, settings, names):
    plan = build_plan(_cfg(**({"topology.name": "ring"} | settings)), data=False)
    with pytest.raises(ConfigError) as err:
        timing.simulate_timing(plan, tmp_path / "refused")
    line = str(err.value)
    assert names in line and "\n" not in line and line.startswith("simulate --timing-only:")
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("settings", [
    {"algo.name": "diloco", "net.bw_profile": "skewed", "net.latency_ms": 20.0},
    {"algo.name": "diloco", "net.bw_profile": "two-cluster", "comm.codec": "topk"},
    {"algo.name": "diloco", "workers": 32, "net.bw_profile": "skewed", "net.latency_ms": 20.0,
     "comm.codec": "int8"},
    {"algo.name": "gasloc", "topology.name": "expander", "net.bw_profile": "skewed",
     "net.latency_ms": 20.0},
], ids=["diloco-tcp", "diloco-topk-gather", "diloco-32-int8-tcp", "gasloc-expander-tcp"])
def test_rounds_in_pieces_equal_simulate_to_the_float(tmp_path, monkeypatch, settings):
    """Every round of more than 3 messages handed to the clock 3 messages at a time (as a
    ring All-Reduce's rounds are at scale): still simulate's rows, links and wall-clock."""
    monkeypatch.setattr(timing, "CHUNK_MESSAGES", 3)
    full, timed = _assert_timing_equals_simulate(tmp_path, settings)
    assert timed.bytes_sent_total == full.bytes_sent_total


def _replay(plan, pieces: list | None = None):
    """Rows and links' busy seconds of ``plan``'s timing replay; ``pieces`` gets the number of
    steps of each piece the programs hand to the clock."""
    clock, counted = timing.timing_clock(plan, emit=(rows := []).append)
    if pieces is not None:
        source = clock.source

        def counting(lane):
            ops = source(lane)
            pieces.append(len(ops or ()))
            return ops
        clock.source = counting
    timing.play(clock)
    assert clock.finished()
    return rows, clock.link_busy_s, counted, clock.now_s


def test_a_ring_round_in_pieces_is_timed_as_the_whole_round(monkeypatch):
    """DiLoCo at 48 workers: 188 messages a worker and round, handed over 16 at a time, give
    the rows, link times, bytes and end of the round handed over whole, bit for bit."""
    cfg = _cfg(**{"workers": 48, "algo.name": "diloco", "net.bw_profile": "skewed",
                  "net.latency_ms": 20.0, "run.rounds": 3})
    whole = _replay(build_plan(cfg, data=False))
    monkeypatch.setattr(timing, "CHUNK_MESSAGES", 16)
    pieces: list[int] = []
    streamed = _replay(build_plan(cfg, data=False), pieces)
    assert streamed == whole
    # a compute, then pieces of at most 16 messages (the last with the row), then Done
    assert max(pieces) <= 17 and len(pieces) == 48 * (3 * (1 + -(-188 // 16)) + 1)


@pytest.mark.parametrize("codec", ["none", "int8", "topk"])
def test_ring_sizes_are_each_receivers_schemas(codec):
    """Every ring message's (wire bytes, raw bytes) at 13 workers (chunks of two lengths)
    equal what a fresh wire schema of its receiver gives, and no receiver's schema nor any
    (sender, receiver, kind) entry is kept for them; a ring kind sent to a worker that is
    not the next one on the ring is still refused by its schema."""
    from gasloc_emu.training.model import count_parameters
    from gasloc_emu.transport.schema import WireSchema
    n = 13
    plan = build_plan(_cfg(**{"workers": n, "algo.name": "diloco", "comm.codec": codec}),
                      data=False)
    numel = count_parameters(plan.cfg.model)
    assert numel % n, "the test needs chunks of two lengths"
    sizes = timing._Size(plan, numel)
    checked = 0
    for src in range(n):
        dst = (src + 1) % n
        schema = WireSchema(dst, n, numel, extra=plan.algo.wire_kinds(numel,
                                                                      plan.algorithm.params),
                            codec=plan.codec, compressed=plan.algo.compressed_kinds)
        for phase in ("rs", "ag"):
            for s in range(n - 1):
                wire = schema.wire_of(src, f"{phase}{s}", 0)
                if wire is None:
                    continue
                values = 1
                for d in wire.shape:
                    values *= d
                expected = (values * {"float32": 4, "uint8": 1}[wire.dtype],
                            4 * (wire.values or values))
                assert sizes.of(src, dst, 0, f"{phase}{s}") == expected, (src, phase, s)
                checked += 1
    assert checked == n * (n - 1) * (1 if codec == "topk" else 2)
    assert not sizes.schemas and not sizes.cache and len(sizes.ring_cache) <= 4
    with pytest.raises(RuntimeError, match="wire schema does not allow"):
        sizes.of(0, 2, 0, "ag0")
