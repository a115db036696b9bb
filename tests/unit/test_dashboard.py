"""The live dashboard: the accumulator's bookkeeping and the pure render of a snapshot."""
from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from gasloc_emu.report import dashboard as D
from gasloc_emu.report import dashboard_state
from gasloc_emu.report.dashboard import LiveView, render, sparkline
from gasloc_emu.report.dashboard_state import DashboardState, Header, LinkView, Snapshot, WorkerView

HEADER = Header(algorithm="gasloc", topology="ring", lambda2=1 / 3, gamma=0.9, profile="skewed",
                shaper="tc", workers=3, rounds=20, devices=("cuda:0", "cuda:1", "cpu"),
                tokens_per_step=512)

SNAP = Snapshot(
    header=HEADER, elapsed_s=75.4, eta_s=301.0, clock_s=70.25,
    workers=(WorkerView(0, "cuda:0", 7, 70, 3.41234, 18250.0, "computing"),
             WorkerView(1, "cuda:1", 7, 64, 3.5, 950.0, "waiting", peer=2),
             WorkerView(2, "cpu", 6, 60, None, None, "failed")),
    links=(LinkView(2, 1, 5.0, 0.0, 2_000_000, waited=True, sending_mbit=4.96),
           LinkView(0, 1, 50.0, 48.7, 12_345_678)),
    links_in_use=6, train_mean=3.456, train_std=0.044, eval_loss=3.5012, eval_round=6,
    consensus=0.1234, train_history=(5.0, 4.5, 4.0, 3.8, 3.6, 3.5), eval_history=(4.2, 3.9, 3.5012),
    warnings=("worker 2 failed: peer lost", "link 1→2 misses its target of 5.0 Mbit/s"))

# checked by eye once; trailing spaces of table cells are stripped before comparing
GOLDEN = """\
gasloc on ring (λ₂ 0.333, γ 0.900) · profile skewed · shaper tc · 3 workers · round 6/20
elapsed 0:01:15 · ETA 0:05:01 · run clock 70.25s

worker   device   round   step   train loss   tokens/s   state
───────────────────────────────────────────────────────────────────────────
     0   cuda:0    7/20     70       3.4123      18.2k   computing
     1   cuda:1    7/20     64       3.5000        950   waiting for peer 2
     2   cpu       6/20     60            -          -   failed

links (2 of 6, longest at their rate)
link    configured   sending at      last 3 s      moved    busy
──────────────────────────────────────────────────────────────────────────
2→1     5.0 Mbit/s   5.0 Mbit/s    0.0 Mbit/s    2.00 MB   3.2 s   1 waits
0→1    50.0 Mbit/s            -   48.7 Mbit/s   12.35 MB   2.0 s

train loss 3.4560 ± 0.0440  eval loss 3.5012 (round 6)  consensus 0.1234
train █▆▃▂▁▁  5.0000 → 3.5000
eval  █▅▁  4.2000 → 3.5012

! worker 2 failed: peer lost
! link 1→2 misses its target of 5.0 Mbit/s
"""


def as_text(renderable) -> str:
    console = Console(record=True, width=120, force_terminal=False, color_system=None,
                      file=io.StringIO())
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def metric(worker, rnd, loss, step=None, **extra):
    return {"worker": worker, "round": rnd, "step": (rnd + 1) * 10 if step is None else step,
            "train_loss": loss, "compute_s": 0.5, "comm_s": 0.1, "wait_s": 0.0,
            "bytes_sent": 100, "bytes_recv": 100, "peers": [], "time_s": rnd + 1.0, **extra}


def test_render_matches_golden_text():
    assert as_text(render(SNAP)) == GOLDEN


def test_the_links_panel_names_each_workers_region_when_the_header_has_them():
    """A placement's regions (bw_profile cloud) label each link by both ends; without them the
    links go by number (the golden text above)."""
    regions = ("aws:us-east-1", "gcp:asia-east1", "aws:eu-west-1")
    snap = dataclasses.replace(SNAP, header=dataclasses.replace(HEADER, regions=regions))
    links = [ln for ln in as_text(render(snap)).splitlines() if "Mbit/s" in ln]
    assert links[0].startswith("2 aws:eu-west-1 → 1 gcp:asia-east1 ")
    assert links[1].startswith("0 aws:us-east-1 → 1 gcp:asia-east1 ")
    assert links[0].rstrip().endswith("1 waits")


def test_render_without_links_evals_or_warnings_leaves_those_sections_out():
    bare = dataclasses.replace(SNAP, links=(), links_in_use=0, eval_loss=None, eval_round=None,
                               eval_history=(), consensus=None, warnings=())
    text = as_text(render(bare))
    assert "links" not in text and "eval" not in text and "!" not in text
    assert "train loss 3.4560 ± 0.0440" in text


def test_many_workers_show_the_ones_furthest_behind():
    workers = tuple(WorkerView(r, "cpu", 9 if r != 37 else 2, 90, 3.0, None, "computing")
                    for r in range(40))
    workers = tuple(dataclasses.replace(w, train_loss=3.0 + w.rank / 100,
                                        state="waiting" if w.rank % 2 else "computing")
                    for w in workers)
    text = as_text(render(dataclasses.replace(SNAP, workers=workers), max_workers=4))
    assert "    37   cpu" in text
    # the 36 others in one line: shown are 0, 1, 2 (round 9, lowest ranks) and 37 (round 2)
    assert "36 more workers (the furthest behind have rows): round 9, train loss " \
           "3.0300-3.3900; 18 computing, 18 waiting" in " ".join(text.split())


def test_metric_rows_fill_worker_rows_and_tokens_per_second():
    st = DashboardState(HEADER, start=0.0)
    st.update(metric(1, 0, 4.0), now=1.0)
    st.update(metric(1, 1, 3.5), now=2.0)
    w = st.snapshot(2.0).workers[1]
    assert (w.device, w.round, w.step, w.train_loss, w.state) == ("cuda:1", 2, 20, 3.5,
                                                                    "computing")
    assert w.tokens_per_s == pytest.approx(512 * 10 / 0.5)


def test_the_last_round_marks_a_worker_done():
    st = DashboardState(dataclasses.replace(HEADER, rounds=2), start=0.0)
    st.update(metric(0, 1, 3.0), now=1.0)
    assert st.snapshot(1.0).workers[0].state == "done"


def test_status_rows_set_state_peer_and_device():
    st = DashboardState(HEADER, start=0.0)
    st.update({"kind": "status", "worker": 2, "state": "waiting", "peer": 0, "round": 4,
               "device": "cuda:3"}, now=1.0)
    w = st.snapshot(1.0).workers[2]
    assert (w.state, w.peer, w.round, w.device) == ("waiting", 0, 5, "cuda:3")
    assert "waiting for peer 0" in as_text(render(st.snapshot(1.0)))


def test_loss_history_grows_once_per_complete_round():
    st = DashboardState(HEADER, start=0.0)
    for w, loss in ((0, 4.0), (1, 5.0)):
        st.update(metric(w, 0, loss, eval_loss=loss + 1), now=1.0)
    assert st.snapshot(1.0).train_history == ()  # worker 2 has not reported round 0
    st.update(metric(2, 0, 6.0, eval_loss=7.0), now=1.0)
    snap = st.snapshot(1.0)
    assert snap.train_history == (5.0,) and snap.eval_history == (6.0,)
    assert snap.eval_loss == 6.0 and snap.eval_round == 1
    assert snap.train_mean == pytest.approx(5.0)
    assert snap.train_std == pytest.approx((2 / 3) ** 0.5)


def test_rounds_complete_without_a_failed_worker():
    st = DashboardState(HEADER, start=0.0)
    st.update({"kind": "status", "worker": 2, "state": "failed", "error": "killed"}, now=1.0)
    st.update(metric(0, 0, 4.0), now=1.0)
    st.update(metric(1, 0, 5.0), now=1.0)
    snap = st.snapshot(1.0)
    assert snap.train_history == (4.5,)
    assert "worker 2 failed: killed" in snap.warnings


def test_links_keep_the_latest_rates_and_show_the_top_k_by_bytes():
    st = DashboardState(HEADER, start=0.0, top_links=2)
    links = [{"src": s, "dst": d, "configured_mbit": 50.0, "bytes": b, "mbit_now": 40.0}
             for s, d, b in ((0, 1, 10), (1, 2, 30), (2, 0, 20), (1, 0, 0))]
    st.update({"kind": "links", "links": links}, now=1.0)
    st.update({"kind": "links", "links": [dict(links[0], bytes=99)]}, now=2.0)
    snap = st.snapshot(2.0)
    assert [(lk.src, lk.dst, lk.bytes) for lk in snap.links] == [(0, 1, 99), (1, 2, 30)]
    assert snap.links_in_use == 3


def test_the_senders_rtt_and_retransmits_show_when_sampled_and_only_then():
    st = DashboardState(HEADER, start=0.0)
    row = {"src": 0, "dst": 1, "configured_mbit": 50.0, "bytes": 10, "mbit_now": 40.0}
    st.update({"kind": "links", "links": [row]}, now=1.0)
    assert "rtt" not in as_text(D._links_table(st.snapshot(1.0)))
    st.update({"kind": "links", "links": [row | {"tcp_rtt_ms": 100.66, "tcp_retrans_segs": 3}]},
              now=2.0)
    text = as_text(D._links_table(st.snapshot(2.0)))
    assert "rtt" in text and "retrans" in text and "100.7 ms" in text
    assert text.split("\n")[-2].split()[-1] == "3"


def test_the_links_that_bound_the_run_come_first_and_say_who_waits():
    """Gossip moves the same bytes on every link: the slow ones are what every round waits
    for, so they lead the panel, marked while their receiver waits on them."""
    st = DashboardState(HEADER, start=0.0, top_links=2)
    links = [{"src": s, "dst": d, "configured_mbit": rate, "bytes": 14_470_000, "mbit_now": 0.0}
             for s, d, rate in ((0, 1, 50.0), (7, 1, 5.0), (1, 2, 50.0), (2, 3, 5.0))]
    st.update({"kind": "links", "links": links}, now=1.0)
    st.update({"kind": "status", "worker": 1, "state": "waiting", "peer": 7, "round": 4,
               "step": 50}, now=1.0)
    snap = st.snapshot(1.0)
    assert {(lk.src, lk.dst, lk.waited) for lk in snap.links} == {(2, 3, False), (7, 1, True)}
    assert snap.links[0].busy_s == pytest.approx(14_470_000 * 8 / 5e6)


def test_the_link_meter_counts_what_arrived_not_what_was_queued(monkeypatch):
    from gasloc_emu.emulator import supervisor
    clock = iter([0.0, 1.0, 2.0])
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: next(clock))
    meter = supervisor.LinkMeter(period_s=1.0, window_s=1.0)
    meter.update(7, {1: 1_000_000})                       # queued at once: a whole model
    meter.update(1, {}, arrived={7: 125_000})              # of which 1 Mbit has crossed
    rows = meter.rows(lambda s, d: 5.0)
    assert rows == [{"src": 7, "dst": 1, "bytes": 1_000_000, "configured_mbit": 5.0,
                     "mbit_now": 1.0}]
    meter.update(1, {}, arrived={7: 750_000})
    assert meter.rows(lambda s, d: 5.0)[0]["mbit_now"] == pytest.approx(5.0)



def test_the_link_meter_reads_the_rate_over_its_window(monkeypatch):
    """Bytes come a whole message at a time: over 3 s (the default window) two 0.625 MB
    messages ending in one second read 5 Mbit/s on a 5 Mbit/s link, not the 10 of 1 s."""
    from gasloc_emu.emulator import supervisor
    clock = iter([0.0, 1.0, 2.0, 3.0, 4.0])
    monkeypatch.setattr(supervisor.time, "monotonic", lambda: next(clock))
    meter = supervisor.LinkMeter(period_s=1.0)
    for arrived in (625_000, 625_000, 1_250_000):       # at 1, 2 and 3 s
        meter.update(1, {}, arrived={7: arrived})
        meter.rows(lambda s, d: 5.0)
    meter.update(1, {}, arrived={7: 2_500_000})          # two messages in the last second
    assert meter.rows(lambda s, d: 5.0)[0]["mbit_now"] == pytest.approx(5.0)


def test_a_link_whose_messages_cross_too_fast_warns_once():
    """Judged from the messages' transfer times, not from a window's delivered bytes: two
    messages ending in one second read 7.7 Mbit/s on a 5 Mbit/s link that kept its rate."""
    st = DashboardState(HEADER, start=0.0)
    link = {"src": 0, "dst": 1, "configured_mbit": 5.0, "bytes": 1, "mbit_now": 7.7,
            "training_goodput_mbit": 4.9}
    st.update({"kind": "links", "links": [link]}, now=0.0)
    assert st.snapshot(0.0).warnings == ()
    for t in range(1, 5):
        st.update({"kind": "links", "links": [link | {"training_goodput_mbit": 9.0}]},
                  now=float(t))
    assert st.snapshot(5.0).warnings == (
        "link 0→1 delivers 9.0 Mbit/s, above its target of 5.0 Mbit/s (not shaped?)",)


def test_dropped_messages_and_warning_rows_are_kept_distinct_and_bounded():
    st = DashboardState(HEADER, start=0.0, max_warnings=3)
    st.update(metric(1, 0, 4.0, dropped=2), now=1.0)
    st.update(metric(1, 1, 4.0, dropped=3), now=2.0)  # rows carry the cumulative count
    for text in ("a", "b", "a"):
        st.update({"kind": "warning", "text": text}, now=2.0)
    assert st.snapshot(2.0).warnings == (
        "worker 1: 3 message(s) dropped (last in round 2)", "b", "a")
    st.update({"kind": "warning", "text": "c"}, now=2.0)
    assert st.snapshot(2.0).warnings == ("b", "a", "c")


def test_a_silent_worker_is_reported_late():
    st = DashboardState(dataclasses.replace(HEADER, rounds=3), start=0.0, late_after_s=10.0)
    for t in (1.0, 2.0, 3.0):  # workers 0 and 1 finish; done workers are never late
        st.update(metric(0, int(t) - 1, 4.0), now=t)
        st.update(metric(1, int(t) - 1, 4.0), now=t)
    st.update({"kind": "status", "worker": 2, "state": "computing", "round": 0}, now=0.5)
    assert st.snapshot(5.0).warnings == ()
    assert st.snapshot(25.5).warnings == ("worker 2 late: silent for 25s in round 1",)


def test_eta_follows_the_rate_of_reported_rounds():
    st = DashboardState(dataclasses.replace(HEADER, rounds=4), start=0.0)
    for w in range(3):
        st.update(metric(w, 0, 4.0), now=10.0)
    snap = st.snapshot(10.0)
    assert snap.elapsed_s == 10.0 and snap.eta_s == pytest.approx(30.0)
    assert DashboardState(HEADER, start=0.0).snapshot(1.0).eta_s is None


def test_unknown_kinds_are_ignored_and_snapshots_do_not_change_afterwards():
    st = DashboardState(HEADER, start=0.0)
    st.update({"kind": "future-thing", "x": 1}, now=1.0)
    before = st.snapshot(1.0)
    st.update(metric(0, 0, 4.0), now=2.0)
    assert before.workers[0].round == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.elapsed_s = 3.0  # type: ignore[misc]


def test_summary_rows_give_final_numbers():
    st = DashboardState(HEADER, start=0.0)
    st.update({"kind": "summary", "final_eval_loss": 3.25, "consensus_distance": 0.5}, now=1.0)
    text = as_text(render(st.snapshot(1.0)))
    assert "final eval (average model) 3.2500" in text and "consensus 0.5" in text


def test_sparkline_scales_between_min_and_max():
    assert sparkline([1.0, 2.0, 3.0]) == "▁▅█"
    assert sparkline([2.0, 2.0]) == "▅▅"
    assert sparkline([]) == "" and len(sparkline(range(100), width=40)) == 40


def test_header_from_plan_reads_the_graph_and_tokens_per_step():
    from gasloc_emu.config import resolve
    from gasloc_emu.plan import build_plan
    from gasloc_emu.training.model import shape_from_config
    cfg = resolve(overrides={"workers": 4, "topology.name": "ring"})
    h = dashboard_state.header_from_plan(build_plan(cfg, data=False), devices=["cpu"] * 4)
    assert (h.algorithm, h.topology, h.workers) == ("gasloc", "ring", 4)
    assert h.lambda2 == pytest.approx(1 / 3)
    assert h.tokens_per_step == cfg.data.batch_size * shape_from_config(cfg.model).block_size


def test_live_view_redraws_on_its_timer_not_per_row(monkeypatch):
    calls = []
    real = D.render
    monkeypatch.setattr(D, "render", lambda snap, **kw: calls.append(1) or real(snap, **kw))
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with LiveView(HEADER, console=console, refresh_hz=4) as view:
        for r in range(300):
            for w in range(3):
                view(metric(w, r % 20, 4.0))
    assert len(calls) < 20  # 900 rows fed; only a handful of timer or final redraws
    assert "computing" in out.getvalue() or "done" in out.getvalue()


def test_a_worker_others_wait_for_is_reported_late():
    st = DashboardState(HEADER, start=0.0, late_after_s=10.0)
    for t in (1.0, 5.0, 12.0):  # heartbeats: the waits go on, their clocks keep running
        for waiter in (0, 1):
            st.update({"kind": "status", "worker": waiter, "state": "waiting", "peer": 2,
                       "round": 3}, now=t)
        st.update({"kind": "status", "worker": 2, "state": "computing", "round": 3}, now=t)
    assert st.snapshot(12.0).warnings == ("worker 2 late: worker(s) 0, 1 waiting for it",)
    st.update({"kind": "status", "worker": 0, "state": "waiting", "peer": 1, "round": 3},
              now=12.5)  # a different peer: a new wait
    assert st.snapshot(13.0).warnings == ("worker 2 late: worker(s) 1 waiting for it",)


def test_heartbeats_with_missing_fields_keep_what_is_known():
    st = DashboardState(HEADER, start=0.0)
    st.update(metric(0, 0, 4.0), now=1.0)
    st.update({"kind": "status", "worker": 0, "state": None, "peer": None, "round": None,
               "step": None, "device": None}, now=2.0)
    w = st.snapshot(2.0).workers[0]
    assert (w.state, w.round, w.step, w.device) == ("computing", 1, 10, "cuda:0")
    st.update({"kind": "status", "worker": 1, "state": "starting", "round": -1, "step": 0},
              now=2.0)
    assert st.snapshot(2.0).workers[1].round == 0


def test_repeated_failed_status_counts_the_worker_once():
    st = DashboardState(HEADER, start=0.0)
    for _ in range(3):
        st.update({"kind": "status", "worker": 2, "state": "failed"}, now=1.0)
    st.update(metric(0, 0, 4.0), now=1.0)
    assert st.snapshot(1.0).train_history == ()  # still waits for worker 1
    st.update(metric(1, 0, 5.0), now=1.0)
    assert st.snapshot(1.0).train_history == (4.5,)


def test_a_malformed_row_becomes_a_warning_not_an_exception():
    st = DashboardState(HEADER, start=0.0)
    st.update({"round": 1}, now=1.0)  # no worker
    st.update({"kind": "links", "links": [{"src": 0}]}, now=1.0)
    assert st.snapshot(1.0).warnings == ("ignored a malformed metric row (KeyError('worker'))",
                                         "ignored a malformed links row (KeyError('dst'))")


def test_drops_line_shows_totals_and_top_reasons():
    snap = dataclasses.replace(SNAP, warnings=(), drops=9,
                               drop_reasons=(("stale", 4), ("duplicate", 3), ("round", 1),
                                             ("src", 1)),
                               control_drops=(("spoofed", 2),))
    assert ("dropped 9 data-plane (stale 4, duplicate 3, round 1, +1 more) · 2 control "
            "(spoofed 2)") in as_text(render(snap))
    assert "dropped" not in as_text(render(SNAP))  # nobody reports drops: no line (simulator)
    clean = as_text(render(dataclasses.replace(SNAP, drops=0)))
    assert "dropped 0 data-plane · 0 control\n" in clean  # an emulator run without drops


def test_status_rows_feed_the_drops_line_with_each_workers_latest_counts():
    st = DashboardState(HEADER, start=0.0)
    assert st.snapshot(1.0).drops is None
    st.update({"kind": "status", "worker": 0, "state": "computing", "dropped": 0,
               "drop_reasons": {}}, now=1.0)
    assert st.snapshot(1.0).drops == 0
    for t, reasons in ((2.0, {"stale": 1}), (3.0, {"stale": 2, "duplicate": 1})):  # cumulative
        st.update({"kind": "status", "worker": 1, "state": "waiting", "peer": 0,
                   "dropped": sum(reasons.values()), "drop_reasons": reasons}, now=t)
    st.update({"kind": "status", "worker": 2, "state": "computing", "dropped": 2,
               "drop_reasons": {"duplicate": 2}}, now=3.0)
    st.update({"kind": "control_drops", "drops": {"hb.sent": 1, "spoofed": 3}}, now=3.0)
    snap = st.snapshot(3.0)
    assert snap.drops == 5 and snap.drop_reasons == (("duplicate", 3), ("stale", 2))
    assert snap.control_drops == (("spoofed", 3), ("hb.sent", 1))
    assert ("dropped 5 data-plane (duplicate 3, stale 2) · 4 control (spoofed 3, hb.sent 1)"
            in as_text(render(snap)))


def test_a_malformed_drops_row_becomes_a_warning():
    st = DashboardState(HEADER, start=0.0)
    st.update({"kind": "control_drops", "drops": ["spoofed"]}, now=1.0)
    st.update({"kind": "status", "worker": 0, "drop_reasons": {"stale": "many"}}, now=1.0)
    snap = st.snapshot(1.0)
    assert snap.control_drops == () and snap.drops is None
    assert len(snap.warnings) == 2 and all("malformed" in w for w in snap.warnings)


def test_rounds_not_committed_are_shown_by_worker_and_round():
    """DiLoCo's rounds broken by a lost peer (``uncommitted`` in a row): counted, the latest
    first, in red; no line without any."""
    st = DashboardState(HEADER, start=0.0)
    st.update(metric(0, 2, 4.0), now=1.0)
    assert st.snapshot(1.0).uncommitted == ()
    assert "not committed" not in as_text(render(st.snapshot(1.0)))
    for worker, rnd in ((0, 3), (1, 3), (1, 4)):
        st.update(metric(worker, rnd, 4.0) | {"uncommitted": True}, now=2.0)
    snap = st.snapshot(2.0)
    assert snap.uncommitted == ((0, 3), (1, 3), (1, 4))
    assert ("not committed: 3 worker-round(s) (worker 1 round 5, worker 1 round 4, worker 0 "
            "round 4)") in as_text(render(snap))


def test_the_header_shows_the_fidelity_verdict_as_it_stands_and_the_time_scale():
    from gasloc_emu.report import fidelity
    state = DashboardState(Header(workers=2, rounds=3, time_scale=4.0), start=0.0)
    assert "fidelity" not in as_text(render(state.snapshot(now=1.0)))
    late = {"late_release": {"count": 9, "p50_ms": 27.0, "p99_ms": 74.0, "max_ms": 90.0}}
    verdict = fidelity.judge([fidelity.LinkPlan(0, 1, 40.0, 15.0)], line=late)
    state.update({"kind": "fidelity", "fidelity": verdict.to_json(),
                  "headline": verdict.headline()}, now=1.0)
    head = as_text(render(state.snapshot(now=2.0))).splitlines()[:4]
    assert any("time scale K 4" in ln for ln in head), head
    assert any(ln.startswith("fidelity: degraded: the packet line released frames late: p99 74")
               for ln in head), head
    assert "time scale" not in as_text(render(DashboardState(Header()).snapshot()))
