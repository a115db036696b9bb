"""The results page: one section per preset, written from a sweep's report (tables, the search
that was done, verdicts) and replaced in place in docs/RESULTS.md.
"""
from __future__ import annotations

import math
from pathlib import Path

from gasloc_emu.experiments.spec import fmt_value, point_label, seeds_words, short_names


def _pm(stat, fmt: str = "{:.4f}", seeds: int = 0) -> str:
    """'mean ± sample sd', with n where fewer than the ``seeds`` reported have a value (a run
    that missed a target, one that failed); one value: 'mean (n=1)'."""
    mean, sd, _, n = stat
    if mean is None:
        return "-"
    count = f" (n={n})" if sd is None or n < seeds else ""
    return (fmt.format(mean) if sd is None else f"{fmt.format(mean)} ± {fmt.format(sd)}") \
        + count


def _tune_words(spec: dict) -> str:
    return "tune " + seeds_words(spec["tune_seeds"])


def _seed_words(rows: list[dict]) -> str:
    """The reported seeds: one list, or each group's where some got more (a close verdict)."""
    lists = {tuple(r["seeds"]) for r in rows}
    if len(lists) == 1:
        return f"seeds {list(next(iter(lists)))}"
    by_group = {}
    for r in rows:
        by_group.setdefault(r["group"] or "all", r["seeds"])
    return "seeds " + "; ".join(f"{list(v)} ({g})" for g, v in by_group.items())


def markdown_section(name: str, report: dict, command: str, plot_rel: str) -> str:
    spec = report["spec"]
    emulated = spec["mode"] == "run"
    timed = spec["x_axis"] == "both"
    clock = "wall-clock s (emulator)" if emulated else "predicted s (simulator)"
    grids = _arm_grids(spec, report["rows"])
    own = len(set(grids.values())) > 1   # the arms did not all search the same grid
    searched = any(grids.values())   # without any search there is no "best" to report
    tuning = f"{_search_sentence(spec, grids)}, best value kept for the reported seeds" \
        if searched else "no search: each arm runs the settings the preset gives it"
    lines = [f"## {spec['title']}", "", f"Claim: {spec['claim']}.", "",
             f"Command: `{command}`", "",
             f"Mode: {spec['mode']} ({_mode_words(emulated, timed, report.get('batched'))}); "
             "reported "
             f"{_seed_words(report['rows'])}; {tuning}. Mean ± sample standard deviation over "
             "the reported seeds. Final eval loss is that of the average of the workers' models; "
             "consensus distance is the RMS distance of the workers' parameters to that average.",
             ""]
    if own:
        lines += [f"Each arm's search on {_tune_words(spec)}:", ""]
        lines += [f"- {arm}: {_search_words(tune)}, {_runs(_grid_size(tune))}"
                  for arm, tune in grids.items()]
        lines += [""]
    # arms that searched different keys: each cell names its keys; otherwise the header does
    keyed = len({tuple(k for k, _ in tune) for tune in grids.values()}) > 1
    names = short_names(dict.fromkeys(k for tune in grids.values() for k, _ in tune))
    common = next(iter(grids.values()), ())  # every arm's keys, when they all searched the same
    best_head = "best" if keyed else f"best {', '.join(k for k, _ in common)}"
    predicted = timed and spec.get("predict", False)  # a run-mode sweep's simulated twin
    faulty = any("faults_due" in r for r in report["rows"])  # random faults: what they did
    lines += ["| arm | " + (f"{best_head} | " if searched else "") + "final eval loss | "
              "consensus distance | "
              + (f"time to eval loss {spec['target_loss']} (s) | {clock} | " if timed else "")
              + ("predicted s (simulator) | " if predicted else "") + "MB sent |"
              + (" faults due | leaves fired | joins fired | drops |" if faulty else ""),
              "| --- | --- | --- | " + ("--- | " if searched else "")
              + ("--- | --- | " if timed else "") + ("--- | " if predicted else "") + "--- |"
              + (" --- | --- | --- | --- |" if faulty else "")]
    for r in report["rows"]:
        mb = r["bytes_sent_total"]
        best = _best_pairs(r["best"], grids[r["arm"]], names) if keyed else \
            _best_words(r["best"])
        k = len(r["seeds"])
        lines.append(f"| {r['arm']} | " + (f"{best} | " if searched else "")
                     + f"{_pm(r['final_eval_loss'], seeds=k)} | "
                     + f"{_pm(r['consensus_distance'], '{:.3f}', k)} | "
                     + (f"{_pm(r['time_to_target_s'], '{:.1f}', k)} | "
                        f"{_pm(r['wall_s'], '{:.1f}', k)} | " if timed else "")
                     + (f"{_pm(r['predicted_s'], '{:.1f}', k)} | " if predicted else "")
                     + f"{'-' if mb[0] is None else f'{mb[0] / 1e6:.1f}'} |"
                     + (_fault_cells(r, k) if faulty else ""))
    lines += ["", f"![{name}]({plot_rel})"]
    if report.get("tuning_plot"):
        lines += ["", f"The whole search, {_tune_words(spec)}, one heat map per arm:", "",
                  f"![{name} search]({plot_rel.removesuffix('.png')}-tuning.png)"]
    lines += ["", f"Verdict (rule: {spec['verdict']}), from the difference of each pair of runs "
              "with the same seed (same initialisation and data order), mean [95 % interval]:",
              ""]
    lines += [_verdict_line(group, j, spec) for group, judged in report["verdict"].items()
              for j in judged]
    m = report["machine"]
    lines += ["", f"Machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, torch "
              f"{m['torch']}, GPU {m['gpu'] or 'none'}; its {report['runs']} runs (search "
              f"included) took {report['run_seconds'] / 60:.1f} min of wall-clock.", ""]
    return "\n".join(lines)


def _fault_cells(row: dict, seeds: int) -> str:
    """A faulty run's counts (``data.run_row``'s faults): due by its clock's end, the leaves
    and joins that fired, the data-plane messages dropped; '-' for an arm without faults."""
    keys = ("faults_due", "faults_left", "faults_joined", "faults_drops")
    return "".join(f" {_pm(row[k], '{:.1f}', seeds) if k in row else '-'} |" for k in keys)


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _arm_grids(spec: dict, rows: list[dict]) -> dict[str, tuple]:
    """Each reported arm's grid, ((key, (values...)), ...): its own or the sweep-wide one
    (hashable, so that arms' grids can be compared; results.json gives lists)."""
    def frozen(tune) -> tuple:
        return tuple((k, tuple(v)) for k, v in tune or ())
    own = {a["name"]: a.get("tune") for a in spec.get("arms", ())}
    return {r["arm"]: frozen(own.get(r["arm"]) or spec.get("tune")) for r in rows}


def _grid_size(tune: tuple) -> int:
    return math.prod(len(v) for _, v in tune)


def _search_sentence(spec: dict, grids: dict[str, tuple]) -> str:
    """How the arms were tuned, for the Mode paragraph: one search for all, or each its own
    (listed after the paragraph); and the equal budget when the preset asks for one."""
    first = _tune_words(spec)
    sizes = sorted({_grid_size(t) for t in grids.values()})
    if len(set(grids.values())) <= 1:
        tune = next(iter(grids.values()), spec.get("tune") or ())
        words = f"the same search over {_search_words(tune)} on {first} for every arm"
    elif len(sizes) == 1 and not spec.get("equal_budget"):
        words = f"each arm's own search (below), {sizes[0]} points each on {first}"
    elif len(sizes) == 1:
        words = f"each arm's own search (below) on {first}"
    else:
        words = (f"each arm's own search (below) on {first}, from {sizes[0]} to "
                 f"{sizes[-1]} points per arm")
    if spec.get("equal_budget") and len(sizes) == 1:
        words += f"; every arm had the same budget of {sizes[0]} points"
    return words


def _search_words(tune) -> str:
    """'algo.inner.lr [0.001, 0.003]', or the grid 'algo.outer_lr [0.5, 1.0] x algo.momentum
    [0.0, 'auto']' (every combination), or 'nothing'."""
    if not tune:
        return "nothing"
    words = " x ".join(f"{k} {list(v)}" for k, v in tune)
    return words if len(tune) == 1 else f"the grid {words} (every combination)"


def _best_pairs(best, tune: tuple, names: dict[str, str]) -> str:
    """results.json's best as 'outer_lr 0.5, momentum auto, lr 0.002': for a table whose arms
    searched different keys, so a bare value would not say what it is."""
    if best is None:
        return "-"
    point = tuple(best) if isinstance(best, list) else (best,)
    return ", ".join(f"{names[k]} {fmt_value(v)}" for (k, _), v in zip(tune, point, strict=True))


def _best_words(best) -> str:
    """results.json's best (``point_value``) as ``point_label`` writes the point."""
    if best is None:
        return "-"
    return point_label(tuple(best) if isinstance(best, list) else (best,))


def _mode_words(emulated: bool, timed: bool, batched: bool = False) -> str:
    if emulated:
        return "real worker processes over the shaped network"
    if batched:
        return _mode_words(False, timed) + "; every worker's inner steps computed as one batch " \
            "(sim.batched), equal to the per-worker simulator to float rounding"
    if timed:  # time is the point: the compute model's nominal step times make it meaningful
        return ("in-process simulator; its clock is the compute model's time (nominal step "
                "times where compute.step_time_s is set) plus modelled transfers")
    return ("in-process simulator: only rounds matter here; its clock is compute time plus "
            "modelled transfers")


def _verdict_line(group: str, j: dict, spec: dict) -> str:
    if "value" not in j:
        return f"- {group}: {j['arm']}: not judged ({j['why']})"
    timed = j["key"] == "time_to_target_s"
    fmt = (lambda v: "never" if v is None else f"{v:.1f} s") if timed \
        else (lambda v: "-" if v is None else f"{v:.4f}")
    rule = {"beats": "lower final eval loss than", "faster": "reaches the target sooner than",
            "competitive": f"within {spec['tolerance']:.0%} of the best of"}[spec["verdict"]]
    parts = [_against(c, timed, relative=spec["verdict"] == "competitive", fmt=fmt)
             for c in j["against"]]
    missed = f" (it missed the target on {j['missed']} of {j['seeds']} seeds)" \
        if j.get("missed") else ""
    return (f"- {group}: {j['arm']} ({fmt(j['value'])}) {rule} {'; '.join(parts)}: "
            f"**{j['holds']}**{missed}")


def _against(c: dict, timed: bool, *, relative: bool, fmt) -> str:
    """One baseline and the paired difference to it: 'dsgd 2.9500, difference -0.0488
    [-0.0612, -0.0364] over 3 seeds'."""
    mean, _, half, n = c["diff"]
    head = f"{c['arm']} {fmt(c['value'])}"
    if mean is None:
        return head + (" (never reached)" if c["value"] is None else ", no pairs")
    show = (lambda v: f"{v:+.1%}") if relative else (lambda v: f"{v:+.1f} s") if timed \
        else (lambda v: f"{v:+.4f}")
    interval = "no interval" if half is None else f"[{show(mean - half)}, {show(mean + half)}]"
    close = ", under two standard deviations" if c.get("close") else ""
    word = "relative difference" if relative else "difference"
    return f"{head}, {word} {show(mean)} {interval} over {n} seeds{close}"


def update_results_page(page: Path, name: str, section: str) -> None:
    """Replace (or append) the section between this experiment's markers."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    text = page.read_text() if page.exists() else "# Results\n"
    block = f"{begin}\n{section}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
