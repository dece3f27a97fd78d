"""The judge bench's report: a markdown table of every (judgment, mode) summary, the mode the bench ranks
better for each judgment, and the results page written from the bench's JSON.

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
    lines = [("| judgment | mode | judged n | accuracy [95% CI] | AUC [95% CI] | flat rate | position effect | "
             "failure rate | calls / judgment | tokens / judgment | s / judgment | s / judgment (cold) |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        lines.append(
            f"| {s['judgment']} | {s['mode']} | {s['accuracy_n']} | {_ci(s['accuracy'], s['accuracy_ci'])} | "
            f"{_ci(s['auc'], s['auc_ci'])} | {_num(s['flat_rate'])} | {_num(s['position_effect'])} | "
            f"{_num(s['failure_rate'])} | {_num(s['calls_per_judgment'])} | {_num(s['tokens_per_judgment'], 0)} | "
            f"{_num(s['seconds_per_judgment'], 1)} | {_num(s.get('seconds_per_judgment_cold'), 1)} |")
    return "\n".join(lines)


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
        out[judgment] = {"mode": best["mode"], "role": best.get("role"),
                         "separated": bool(rest) and not any(_overlap(best["auc_ci"], r["auc_ci"]) for r in rest)}
    return out


def scoring_setting(recommended: dict[str, dict[str, Any]]) -> str:
    """The ``llm.scoring`` block that the recommendation amounts to (roles whose better mode is probability)."""
    roles = sorted({r["role"] for r in recommended.values() if r["mode"] == "probability" and r.get("role")})
    return "llm.scoring: {" + ", ".join(f"{r}: probability" for r in roles) + "}" if roles else \
        "llm.scoring: {}   # text for every role (the default)"


def results_page(result: dict[str, Any]) -> str:
    """docs/results/judges_bench.md from the bench's JSON."""
    meta, rec = result["meta"], result["recommended"]
    sizes = meta["sizes"]
    lines = [
        "# Judge bench: the answer judge and ARBOR's pairwise judge against the oracle",
        "",
        (f"Written by `scripts/judge_bench.py` on {meta['date']} at commit `{meta['git_commit']}`"
        f"{' (with uncommitted changes)' if meta.get('git_dirty') else ''}; do not edit by hand."),
        "",
        f"    {meta['command']}",
        "",
        (f"Judge model: {meta['judge_model']} ({meta['device']}). Trajectory set `{meta['set_version']}`, "
        f"sha256 `{meta['set_sha256'][:16]}`, world seed {meta['world_seed']}: {sizes['questions']} questions, "
        f"{sizes['trajectories']} trajectories ({', '.join(f'{k} {v}' for k, v in sizes['variants'].items())}). "
        f"Answer judge: {sizes['answer_items']} answers that string matching cannot decide "
        f"({sizes['answer_positive']} right, {sizes['answer_negative']} wrong), each judged once per mode. "
        f"Pairwise judge: {sizes['pairs']} pairs (gold against each perturbation; the oracle prefers one in "
        f"{sizes['pairs_with_preference']}), each judged in both orders per mode, on the rubric "
        f"\"{meta['rubric']['title']}\". Response cache {'on' if meta['cache'] else 'off'}; total wall time "
        f"{meta['wall_s'] / 60:.1f} min."),
        "",
        table(result["summaries"]),
        "",
        ("Accuracy: the verdict agrees with the oracle (answer judge: right/wrong, a probability read at 0.5; "
        "pairwise: the oracle's preferred trajectory wins, over the pairs where the oracle prefers one, both orders). "
        "AUC: the verdict's value (the sampled label's in text mode, the probability-weighted one in probability "
        "mode) as a score for the oracle's label. Flat rate: TIE where the oracle prefers one. Position effect: "
        "pairs whose two orders got the same position as winner. Calls, tokens and seconds are per judgment, "
        "from the judges' tallies and the wall clock around each call (one call at a time on the shared CPU); the "
        "two modes of one prompt are asked back to back, each first for every other prompt, and the cold column "
        "counts only the judgments asked first (the other reuse the server's prompt cache)."),
        "",
        "## Per perturbation (pairwise, accuracy over both orders)",
        "",
        "| mode | " + " | ".join(result["per_variant_columns"]) + " |",
        "|---|" + "---|" * len(result["per_variant_columns"]),
    ]
    for mode, row in result["per_variant"].items():
        lines.append(f"| {mode} | " + " | ".join(row[c] for c in result["per_variant_columns"]) + " |")
    lines += ["", "## Which mode the bench ranks better", ""]
    for judgment, r in rec.items():
        lines.append(f"- {judgment} (role `{r['role']}`): **{r['mode']}**"
                     + ("" if r["separated"] else " (AUC intervals overlap: a lean at this size, not a settled result)"))
    lines += ["", "Recommended setting (params.yaml's defaults are left as they are):", "",
              f"    {scoring_setting(rec)}", ""]
    if result.get("notes"):
        lines += ["## Notes", ""] + [f"- {n}" for n in result["notes"]] + [""]
    return "\n".join(lines)
