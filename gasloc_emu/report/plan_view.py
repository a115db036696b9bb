"""The derived run plan as text (``gasloc-emu config --plan``): pure, from ``RunPlan.describe()``.

Every line starts with ``# ``, so the settings printed above it stay a loadable TOML file.
"""
from __future__ import annotations

from collections.abc import Sequence

MAX_LINK_ROWS = 64      # more links than this: the first ones, then how many were left out


def plan_lines(plan: dict, used: Sequence[tuple[int, int]]) -> list[str]:
    """``plan``: ``RunPlan.describe()``; ``used``: the directed links training sends on."""
    out = ["derived plan (what these settings make of the run; not settings)"]
    out += _algorithm(plan) + _topology(plan["topology"]) + _compute(plan["compute"])
    out += [f"codec: {plan['codec']}"] + _links(plan["links"], used)
    out += [f"simulate times messages by: {plan['link_model']}"] + _world(plan["world"])
    out += _time_scale(plan.get("time_scale"))
    return [f"# {line}".rstrip() for line in out]


def _algorithm(plan: dict) -> list[str]:
    algo = plan["algorithm"]
    consts = ", ".join(f"{k} = {v:g}" for k, v in plan["constants"].items())
    params = ", ".join(f"{k} = {v!r}" for k, v in algo.get("params", {}).items())
    return [f"algorithm: {algo['name']} ({algo['object']}, {algo['package']} "
            f"{algo['version']})" + (f"; {consts}" if consts else "")
            + (f"; params {params}" if params else "")]


def _time_scale(ts: dict | None) -> list[str]:
    """K, what it plays, and under 'auto' the estimate K was picked from (the links above are
    the asked ones; the shaper plays them as this line says)."""
    if ts is None:
        return []
    lines = [f"time scale: K = {ts['time_scale']:g} (asked {ts['asked']!r}): {ts['played_as']}"]
    auto = ts.get("auto")
    if auto:
        lines.append(f"  auto: peak {auto['peak_fps']:.0f} frames/s at K = 1, "
                     f"{auto['peak_fps_at_k']:.0f} at K = {auto['time_scale']:g}, against "
                     f"{auto['margin']:.0%} of {auto['capacity_fps']:.0f} frames/s the line "
                     f"moves here ({auto['capacity_source']})")
    return lines


def _topology(graph: dict) -> list[str]:
    if "lambda2" not in graph:
        return [f"graph: {graph['name']} (no gossip graph)"]
    kind = "E[W] over rounds" if graph["time_varying"] else "W"
    out = [f"graph: {graph['name']}; lambda2 ({kind}) = {graph['lambda2']:.6f}, spectral gap = "
           f"{graph['spectral_gap']:.6f}"]
    peers = graph.get("peers")  # absent from plans described before peers were recorded
    if peers is not None:
        out.append(f"  peers chosen by {peers['rule']}")
        if peers["bottleneck_mbit"] is not None:
            out.append(f"  slowest edge a round may use: {peers['bottleneck_mbit']:g} Mbit/s")
    if graph["neighbours"] is None:
        return out + ["  neighbours: drawn anew each round"]
    return out + [f"  worker {i:3d}: peers {p}" for i, p in enumerate(graph["neighbours"])]


def _compute(c: dict) -> list[str]:
    steps = c["steps_per_round"]
    return [f"compute: profile {c['profile']}, step_time_s = {c['step_time_s']:g}, "
            f"inner_budget_s = {c['inner_budget_s']:g}",
            f"  speeds: {_compact(c['speeds'])}",
            f"  inner steps per round: {_compact(steps) if steps is not None else 'by budget'}"]


def _compact(values: Sequence) -> str:
    """``[1.0] * 8`` as ``8 x 1``; a list of differing values as the list."""
    if values and all(v == values[0] for v in values):
        return f"{len(values)} x {values[0]:g}"
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _links(links: dict | None, used: Sequence[tuple[int, int]]) -> list[str]:
    if links is None:
        return ["links: unshaped (no bandwidth profile, or net.shaper = none)"]
    rows = {(r["src"], r["dst"]): r for r in links["links"]}
    pairs = [p for p in used if p in rows]
    out = [f"links: profile {links['profile']}, MTU {links['mtu']}"
           + (f" ({links['note']})" if links["note"] else "")
           + f"; {len(pairs)} of {links.get('count', len(rows))} directed links carry "
           "training" + ("" if len(rows) == links.get("count", len(rows))
                         else " (only those are listed)") + ":",
           f"  {'src':>4} {'dst':>4} {'rate_mbit':>10} {'effective':>10} {'latency_ms':>10} "
           f"{'jitter_ms':>9} {'loss_pct':>8}"]
    for s, d in pairs[:MAX_LINK_ROWS]:
        r = rows[(s, d)]
        out.append(f"  {s:4d} {d:4d} {_num(r['rate_mbit']):>10} {_num(r['effective_mbit']):>10} "
                   f"{r['latency_ms']:10g} {r['jitter_ms']:9g} {r['loss_pct']:8g}")
    if len(pairs) > MAX_LINK_ROWS:
        out.append(f"  ... and {len(pairs) - MAX_LINK_ROWS} more (config --plan-json has all)")
    caps = {k: c for k, c in links["caps"].items() if c["up_mbit"] or c["down_mbit"]}
    out += [f"  worker {k} caps: up {_num(c['up_mbit'])} Mbit/s, down {_num(c['down_mbit'])} "
            "Mbit/s" for k, c in caps.items()]
    return out


def _num(value) -> str:
    return "-" if value is None else f"{value:g}"


def _world(world: dict | None) -> list[str]:
    if world is None:
        return ["scenario: none (every worker, every round, the links as above)"]
    events = world["events"]
    out = [f"scenario: {world['source'] or 'none'}, {len(events)} "
           f"event{'' if len(events) == 1 else 's'}"
           + (f"; new workers {world['new_workers']}" if world["new_workers"] else "")
           + (f"; {world['trace']}" if world["trace"] else "")]
    out += [f"  {text}" for text in events]
    if world["membership"] is None:
        out.append("  (events at a time land on a round when the run gets there)")
    changes = world["link_changes"]
    if changes:
        out.append(f"  link changes: {len(changes)}")
    for ch in changes[:MAX_LINK_ROWS]:
        when = f"round {ch['round']}" if ch.get("round") is not None else f"at {ch['at_s']:g} s"
        out.append(f"  {when}: link {ch['src']} -> {ch['dst']} to "
                   f"{_link_state(ch['rate_mbit'], ch['latency_ms'])}")
    if len(changes) > MAX_LINK_ROWS:
        out.append(f"  ... and {len(changes) - MAX_LINK_ROWS} more (config --plan-json has all)")
    return out


def _link_state(rate_mbit, latency_ms) -> str:
    if rate_mbit == 0.0:
        return "cut"
    rate = "unshaped" if rate_mbit is None else f"{rate_mbit:g} Mbit/s"
    return f"{rate}, {latency_ms:g} ms"
