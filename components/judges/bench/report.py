"""The judge bench's report: a markdown table of every (judgment, mode) summary, the mode the bench ranks
better for each judgment, whether each judgment is above chance, and the results page written from the bench's
JSON.

A mode ranks better when its AUC against the oracle is higher (AUC does not depend on where a threshold sits,
and it is where probability scoring can differ from the sampled label); equal AUCs fall to accuracy, then to
fewer seconds per judgment. Overlapping intervals are said so: at these sizes the ranking is a lean, not a proof.
"""

from __future__ import annotations

from typing import Any


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ci(value: float | None, ci) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")


def table(summaries: list[dict[str, Any]]) -> str:
    """One markdown row per (judgment, mode) summary."""
    lines = [("| judgment | mode | judged n | accuracy [95% CI] | AUC [95% CI] | Kendall tau [95% CI] | Spearman | "
              "flat rate | position effect | attempt effect | failure rate | calls / judgment | tokens / judgment | "
              "s / judgment | s / judgment (cold) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        lines.append(
            f"| {s['judgment']} | {s['mode']} | {s['accuracy_n']} | {_ci(s['accuracy'], s['accuracy_ci'])} | "
            f"{_ci(s['auc'], s['auc_ci'])} | {_ci(s.get('kendall'), s.get('kendall_ci'))} | "
            f"{_num(s.get('spearman'))} | {_num(s['flat_rate'])} | {_num(s['position_effect'])} | "
            f"{_num(s.get('attempt_effect'))} | {_num(s['failure_rate'])} | {_num(s['calls_per_judgment'])} | "
            f"{_num(s['tokens_per_judgment'], 0)} | {_num(s['seconds_per_judgment'], 1)} | "
            f"{_num(s.get('seconds_per_judgment_cold'), 1)} |")
    return "\n".join(lines)


def above_chance(s: dict[str, Any]) -> str:
    """``above``, ``below`` or ``not shown``: where the AUC interval sits against chance (0.5)."""
    ci = s.get("auc_ci")
    if not ci:
        return "not shown"
    return "above" if ci[0] > 0.5 else ("below" if ci[1] < 0.5 else "not shown")


def _key(s: dict[str, Any]) -> tuple:
    return (s["auc"] if s["auc"] is not None else -1.0, s["accuracy"] if s["accuracy"] is not None else -1.0,
            -(s["seconds_per_judgment"] or 0.0))


def _overlap(a, b) -> bool:
    return a is None or b is None or not (a[1] < b[0] or b[1] < a[0])


def recommend(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """For each judgment: the better-ranked mode, and whether its AUC interval overlaps the other's."""
    out: dict[str, dict[str, Any]] = {}
    for judgment in dict.fromkeys(s["judgment"] for s in summaries):
        mine = sorted((s for s in summaries if s["judgment"] == judgment), key=_key, reverse=True)
        best = mine[0]
        rest = mine[1:]
        out[judgment] = {"mode": best["mode"], "role": best.get("role"), "scoring_key": best.get("scoring_key"),
                         "compared": bool(rest),
                         "separated": bool(rest) and not any(_overlap(best["auc_ci"], r["auc_ci"]) for r in rest)}
    return out


def scoring_setting(recommended: dict[str, dict[str, Any]]) -> str:
    """The params the recommendation amounts to: a judgment whose method sets its own scoring (``scoring_key``,
    e.g. ``arbor.judge_scoring``) names that key, the better of text and probability, and itself; the rest give
    the ``llm.scoring`` block of their roles (those whose better mode is probability). Setting ``llm.scoring``
    for a role does not reach a judgment whose key is set, hence the split."""
    keyed = [f"{r['scoring_key']}: {r['mode']}   # {name}" for name, r in recommended.items()
             if r.get("scoring_key") and r.get("compared") and r["mode"] in ("text", "probability")]
    roles = sorted({r["role"] for r in recommended.values()
                    if r["mode"] == "probability" and r.get("role") and not r.get("scoring_key")})
    block = ("llm.scoring: {" + ", ".join(f"{r}: probability" for r in roles) + "}" if roles else
             "llm.scoring: {}   # text for every role (the default)")
    return "\n".join([block, *keyed])


def probability_notes(summaries: list[dict[str, Any]]) -> list[str]:
    """A note for each probability-mode summary some of whose judged calls fell back to the sampled label
    (calls, not units: a unit may make several calls, or none when it reuses an earlier verdict). The judged
    calls are the label-choice verdicts counted each way where the summary has both counts (a unit may also make
    calls with no label to read, e.g. the stagewise judge's rubric generation), else the calls that did not fail."""
    notes = []
    for s in summaries:
        calls = round((s.get("calls_per_judgment") or 0) * s["rows"])
        judged = calls - round(s.get("failed_calls", 0))
        if s.get("scored_from_text") is not None:
            judged = s["scored_from_probability"] + s["scored_from_text"]
        if s["mode"] == "probability" and calls and s["scored_from_probability"] < judged:
            notes.append(f"{s['judgment']}, probability mode: {s['scored_from_probability']} of {judged} judged "
                         "calls were read from probabilities; the rest fell back to the sampled label.")
    return notes


def results_page(result: dict[str, Any], figures: str | None = None) -> str:
    """docs/results/judges_bench.md from the bench's JSON; ``figures``, when given, is the sentence naming that JSON
    committed beside the page (:func:`components.reporting.figures.figures_line`)."""
    meta, rec = result["meta"], result["recommended"]
    sizes = meta["sizes"]
    undone = [n for n in meta["judgments_asked"] if n not in meta["judgments_done"]]
    lines = [
        "# Judge bench: the methods' judgments against the oracle",
        "",
        (f"Written by `scripts/judge_bench.py` on {meta['date']} at commit `{meta['git_commit']}`"
         f"{' (with uncommitted changes)' if meta.get('git_dirty') else ''}; do not edit by hand."),
        "",
        f"    {meta['command']}",
        "",
        *([figures, ""] if figures else []),
        (f"Judge model: {meta['judge_model']} ({meta['device']}). Trajectory set `{meta['set_version']}`, "
         f"sha256 `{meta['set_sha256'][:16]}`, world seed {meta['world_seed']}: {sizes['questions']} questions, "
         f"{sizes['trajectories']} trajectories ({', '.join(f'{k} {v}' for k, v in sizes['variants'].items())}); "
         f"{sizes['pairs']} pairs (gold against each perturbation), the oracle prefers one in "
         f"{sizes['pairs_with_preference']}. Units per judgment: "
         f"{', '.join(f'{k} {v}' for k, v in sizes['units'].items())}, each asked once per mode. Response cache "
         f"{'on' if meta['cache'] else 'off'}; total wall time {meta['wall_s'] / 60:.1f} min"
         + (" (" + ", ".join(f"{k} {v / 60:.1f}" for k, v in meta.get("judgment_wall_s", {}).items()) + ")"
            if meta.get("judgment_wall_s") else "") + "."),
        "",
    ]
    if undone:
        lines += [(f"**Not run** (asked, but the run had not reached them when this page was written): "
                   f"{', '.join(undone)}."), ""]
    lines += [
        table(result["summaries"]),
        "",
        ("How each column is read (`components/judges/bench/metrics.py`). Answer judge: accuracy of the verdict "
         "read at 0.5, AUC of the verdict for 'right'. Pairwise (ARBOR): accuracy = the oracle's preferred "
         "trajectory wins, over pairs where it prefers one, both orders; AUC = the verdict's value for A as a "
         "score of 'A is preferred'; flat rate = TIE where the oracle prefers one; position effect = pairs whose "
         "two orders name the same position, attempt effect = the same trajectory. Slate judgments (council, "
         "rubric evaluator, RaR): over pairs of one question's trajectories that the oracle orders (more hops "
         "found, then a right answer), accuracy = the judge orders them the same way, AUC = that with equal "
         "scores counted half (chance 0.5), flat rate = equal scores; Kendall tau-b and Spearman per view of a "
         "slate, averaged; position and attempt effects (council, balanced orders) = the spread of the mean "
         "Borda points by shown position and by trajectory over the slate's range. Calls, tokens and seconds "
         "are per judgment (one call at a time on the shared CPU); the modes of one unit are asked back to back "
         "and the cold column counts only the judgments asked first."),
        "",
    ]
    for judgment, cells_by_mode in result.get("per_variant", {}).items():
        columns = list(dict.fromkeys(c for cells in cells_by_mode.values() for c in cells))
        lines += [f"## {judgment}, per perturbation", "", "| mode | " + " | ".join(columns) + " |",
                  "|---|" + "---|" * len(columns)]
        for mode, cells in cells_by_mode.items():
            lines.append(f"| {mode} | " + " | ".join(cells.get(c, "-") for c in columns) + " |")
        lines.append("")
    lines += ["## Above chance, and the mode the bench ranks better", ""]
    for judgment, r in rec.items():
        verdicts = ", ".join(f"{s['mode']} {above_chance(s)}" for s in result["summaries"]
                             if s["judgment"] == judgment)
        lines.append(f"- {judgment} (role `{r['role']}`): AUC interval against chance: {verdicts}; better mode "
                     f"**{r['mode']}**"
                     + ("" if r["separated"] or not r.get("compared", True)
                        else " (intervals overlap: a lean at this size, not a settled result)"))
    lines += ["", "Recommended setting (params.yaml's defaults are left as they are):", "",
              *(f"    {line}" for line in scoring_setting(rec).splitlines()), "", "## Who may see the reference", ""]
    for name, j in meta["judgments"].items():
        lines.append(f"- {name} ({j['method']}): {j['reference']}: {j['reference_note']}.")
    lines.append("")
    if result.get("gaps"):
        lines += ["## Judgments not on the bench", ""]
        lines += [f"- {g['name']} ({g['method']}): {g['reason']}." for g in result["gaps"]] + [""]
    if result.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)
