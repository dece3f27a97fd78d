"""Judge bench: how well each judgment the methods make agrees with the embedded world's oracle, in text scoring,
probability scoring and reference-guided judging, on the real judge model, over a fixed trajectory set
(:mod:`components.judges.bench.trajectories`); writes its rows and tables under ``--out`` and rewrites
docs/results/judges_bench.md (how the modes are asked and what is written: :func:`main`). A script rather than a
module of components.judges because it loads the methods' judgments; it imports components only.

    .venv/bin/python scripts/judge_bench.py [--questions 8] [--world-seed 7] [--out outputs/judge_bench]
        [--judgments arbor_pairwise coreact_council ...] [--modes text probability reference] [--cache] [--set ...]
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.io import write_json, write_jsonl
from components.judges.bench import metrics, report
from components.judges.bench.registry import MODES, Context, load_gaps, load_judgments
from components.judges.bench.trajectories import SET_VERSION, build_set, pairs, write_set
from components.judges.call import Tally
from components.llm.factory import LLMPool
from components.params_cli import params_from_args, stage_argparser
from components.reporting.figures import figures_line, figures_path, write_figures
from components.retrieval.bm25 import BM25Index
from components.retrieval.scope import world_question_paragraphs
from components.retrieval.tools import make_toolbox
from components.world import generate_world

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JUDGMENTS = ("answer_judge", "arbor_pairwise")


def alternate(modes: list[str], n: int) -> list[str]:
    """The modes in which to ask the ``n``-th unit: every other unit reversed, so that each mode is asked
    first (with a cold server prompt cache) as often as the others."""
    modes = list(modes)
    shift = n % len(modes) if modes else 0
    return modes[shift:] + modes[:shift] if len(modes) > 2 else (modes if n % 2 == 0 else list(reversed(modes)))


def with_llm(params, **update):
    return params.model_copy(update={"llm": params.llm.model_copy(update=update)})


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def model_for(pool: LLMPool, params, role: str):
    """The model of ``role``: its one backend, or the first of a list role (one council judge)."""
    bound = params.llm.roles[role]
    return pool.roles(role)[0] if isinstance(bound, list) else pool.role(role)


def backends_of(params, roles) -> set[str]:
    out = set()
    for role in roles:
        bound = params.llm.roles[role]
        out.update(bound if isinstance(bound, list) else [bound])
    return out


async def ask_unit(judgment, model, unit, mode: str, params, cache: dict) -> dict:
    tally = Tally()
    start = time.perf_counter()
    fields = await judgment.ask(model, unit, Context(mode == "reference", tally, params, cache))
    seconds = time.perf_counter() - start
    return {**fields, "calls": tally.calls, "seconds": seconds, "prompt_tokens": tally.prompt_tokens,
            "completion_tokens": tally.completion_tokens, "failed": tally.failed,
            "scored_from_probability": tally.scored_from_probability, "scored_from_text": tally.scored_from_text}


async def run_bench(params, items, judgments, modes, log, on_judgment) -> dict:
    """Ask every judgment's units in its modes; ``on_judgment(rows)`` after each judgment (all rows so far)."""
    roles = {j.name: j.role(params) for j in judgments}
    # text mode is the sampled word for every benched role, whatever params.yaml's llm.scoring chose for it
    text_scoring = {r: m for r, m in params.llm.scoring.items() if r not in set(roles.values())}
    base = with_llm(params, middleware=params.llm.middleware.model_copy(update={"cache": log["cache"]}),
                    scoring=text_scoring)
    text_pool = LLMPool(base)
    prob_roles = {roles[j.name] for j in judgments if "probability" in j.modes(modes)}
    prob_params = with_llm(base, scoring={**base.llm.scoring, **dict.fromkeys(prob_roles, "probability")})
    prob_pool = LLMPool(prob_params, overrides={b: text_pool.backend(b) for b in backends_of(params, roles.values())},
                        cache_path=Path(params.run.cache_dir) / "llm_responses.sqlite")
    rows: list[dict] = []
    try:
        for j in judgments:
            jmodes = j.modes(modes)
            models = {m: model_for(prob_pool if m == "probability" else text_pool, params, roles[j.name])
                      for m in jmodes}
            caches: dict[str, dict] = {m: {} for m in jmodes}
            started = time.perf_counter()
            units = j.units(items, params)
            for n, unit in enumerate(units):
                for k, mode in enumerate(alternate(jmodes, n)):
                    row = await ask_unit(j, models[mode], unit, mode, params, caches[mode])
                    rows.append({"judgment": j.name, "mode": mode, "unit": unit.id, "slate": unit.slate,
                                 **unit.label, "asked_first": k == 0, **row})
                said = {k: rows[-1][k] for k in ("winner", "meets", "scores", "verdict") if k in rows[-1]}
                print(f"{j.name} {n + 1}/{len(units)} {unit.id}: {rows[-1]['seconds']:.1f}s "
                      f"{rows[-1]['prompt_tokens']} tok {json.dumps(said, default=str)}", flush=True)
            log.setdefault("judgment_wall_s", {})[j.name] = time.perf_counter() - started
            on_judgment(rows)
    finally:
        prob_pool.close()
        text_pool.close()
    return {"rows": rows, "roles": roles}


def summarise(rows, judgments, modes, seed, roles) -> tuple[list[dict], dict]:
    summaries, per_variant = [], {}
    for j in judgments:
        for mode in j.modes(modes):
            mine = [r for r in rows if r["judgment"] == j.name and r["mode"] == mode]
            if not mine:
                continue
            summaries.append({"judgment": j.name, "mode": mode, "method": j.method, "role": roles[j.name],
                              "scoring_key": j.scoring_key, **j.summary(mine, seed), **metrics.cost_summary(mine),
                              "scored_from_probability": sum(r["scored_from_probability"] for r in mine),
                              "scored_from_text": sum(r.get("scored_from_text", 0) for r in mine),
                              "failed_calls": sum(r["failed"] for r in mine)})
            if j.per_variant is not None:
                per_variant.setdefault(j.name, {})[mode] = j.per_variant(mine)
    return summaries, per_variant


def main() -> None:
    """Build the trajectory set (gold trajectories of N world questions and their perturbations, with oracle labels)
    and write it as JSONL with its digest, then ask every selected bench judgment
    (:mod:`components.judges.bench.registry`: each method's ``bench.py``, the answer judge's
    :mod:`components.judges.bench.answer`) about each of its units in each asked mode it has: ``text`` (the params
    as given), ``probability`` (``llm.scoring: probability`` for the judgment's role, set here in code, for label
    choices) and ``reference`` (text scoring with the gold answer and facts shown, where the method's judge may see
    them; each judgment's ``reference_note`` says why or why not). Both scorings share one backend, and the modes
    of one unit are asked back to back (the prompt cache serves the shared prefix), the first mode alternating
    between units so no mode's seconds gain more from it; ``s / judgment (cold)`` is over the judgments asked
    first. The response cache is off unless ``--cache``. Writes ``trajectories.jsonl`` (+ manifest),
    ``rows.jsonl``, ``summary.json`` and ``table.md`` under ``--out``, and rewrites ``--results-page`` (with
    ``summary.json`` beside it as its figures, ``<page>.json``) after each judgment, so a run stopped early leaves the judgments it finished (the page says which were not run)."""
    parser = stage_argparser(__doc__)
    parser.add_argument("--questions", type=int, default=8, help="world questions in the trajectory set")
    parser.add_argument("--world-seed", type=int, default=7, help="seed of the bench's world and perturbations")
    parser.add_argument("--out", default="outputs/judge_bench", help="folder of the bench's outputs")
    parser.add_argument("--judgments", nargs="+", default=list(DEFAULT_JUDGMENTS),
                        help="bench judgments to ask, in this order ('all': every registered one); NAME:MODE+MODE "
                             "asks that one in those of --modes only")
    parser.add_argument("--modes", nargs="+", default=["text", "probability"], choices=list(MODES))
    parser.add_argument("--cache", action="store_true", help="use the response cache (replays: seconds mean nothing)")
    parser.add_argument("--results-page", default="docs/results/judges_bench.md",
                        help="the results page to rewrite ('' for none)")
    parser.add_argument("--bootstrap-seed", type=int, default=0)
    parser.add_argument("--rewrite-page", action="store_true",
                        help="only rewrite --results-page from --out's summary.json, or else from the figures "
                             "committed beside the page (no model is asked)")
    args = parser.parse_args()
    if args.rewrite_page:
        source = Path(args.out) / "summary.json"
        result = json.loads((source if source.exists() else figures_path(ROOT / args.results_page)).read_text())
        keys = {j.name: j.scoring_key for j in load_judgments()}
        for s in result["summaries"]:   # summaries written before a judgment's key existed
            s.setdefault("scoring_key", keys.get(s["judgment"]))
        result["recommended"] = report.recommend(result["summaries"])
        result["recommended_setting"] = report.scoring_setting(result["recommended"])
        result["gaps"] = [dataclasses.asdict(g) for g in load_gaps()]
        result["notes"] = report.probability_notes(result["summaries"])
        write_figures(ROOT / args.results_page, result)
        (ROOT / args.results_page).write_text(report.results_page(result, figures_line(args.results_page)))
        return
    params = params_from_args(args)
    registered = {j.name: j for j in load_judgments()}
    asked = list(registered) if args.judgments == ["all"] else args.judgments
    names = [a.split(":", 1)[0] for a in asked]
    unknown = [n for n in names if n not in registered]
    if unknown:
        parser.error(f"unknown judgment {unknown[0]!r}; registered: {', '.join(registered)}")
    judgments = []
    for a, name in zip(asked, names, strict=True):
        only = a.split(":", 1)[1].split("+") if ":" in a else None
        if only is not None and not set(only) <= set(args.modes):
            parser.error(f"{a}: its modes must be among --modes ({' '.join(args.modes)})")
        j = registered[name]
        if only is not None:  # the same judgment, asked in fewer modes
            j = dataclasses.replace(j, only_modes=tuple(only))
        if not j.modes(args.modes):
            offered = [m for m in MODES if j.modes([m])]
            parser.error(f"{a}: none of --modes {' '.join(args.modes)} applies to it (it is asked in: "
                         f"{', '.join(offered)})")
        judgments.append(j)
    out = Path(args.out)
    started = time.perf_counter()

    w = params.world
    world = generate_world(seed=args.world_seed, n_people=w.n_people, n_films=w.n_films, n_cities=w.n_cities,
                           n_companies=w.n_companies, distractors_per_entity=w.distractors_per_entity,
                           question_mix=w.question_mix, n_questions=max(4 * args.questions, 20))
    questions = world_question_paragraphs(world)
    toolbox = make_toolbox(BM25Index(world.documents), world.documents, top_k=params.retrieval.top_k,
                           snippet_chars=params.retrieval.snippet_chars, scope=params.retrieval.scope)
    titles = sorted({d.title for d in world.documents})
    items = build_set(questions, toolbox, params.agent, titles, args.questions, args.world_seed)
    digest = write_set(items, out / "trajectories.jsonl",
                       {"world_seed": args.world_seed, "retrieval": params.retrieval.model_dump(mode="json"),
                        "agent": params.agent.model_dump(mode="json")})
    print(f"trajectory set {digest[:16]}: {len(items)} trajectories", flush=True)

    roles = {j.name: j.role(params) for j in judgments}
    first = roles[judgments[0].name]
    bound = params.llm.roles[first]
    backend = params.llm.backends[bound[0] if isinstance(bound, list) else bound]
    all_pairs = pairs(items)
    log = {"cache": args.cache}
    meta = {
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain", "--", "components/judges", "components/methods", "scripts")),
        "command": ".venv/bin/python " + " ".join(["scripts/judge_bench.py", *sys.argv[1:]]),
        "judge_model": f"{backend.model} ({backend.type}{', llama.cpp server' if backend.embedded else ''})",
        "device": "CPU, 2 cores shared with other work",
        "set_version": SET_VERSION, "set_sha256": digest, "world_seed": args.world_seed, "cache": args.cache,
        "modes": args.modes, "judgments_asked": names,
        "sizes": {"questions": sum(i.variant == "gold" for i in items), "trajectories": len(items),
                  "variants": {v: sum(i.variant == v for i in items) for v in dict.fromkeys(i.variant for i in items)},
                  "pairs": len(all_pairs), "pairs_with_preference": sum(p is not None for *_, p in all_pairs),
                  "units": {j.name: len(j.units(items, params)) for j in judgments}},
        "judgments": {j.name: {"method": j.method, "role": roles[j.name], "modes": j.modes(args.modes),
                               "reference": j.reference, "reference_note": j.reference_note, "doc": j.doc}
                      for j in judgments},
    }

    def write(rows: list[dict]) -> dict:
        done = list(dict.fromkeys(r["judgment"] for r in rows))
        summaries, per_variant = summarise(rows, judgments, args.modes, args.bootstrap_seed, roles)
        meta.update(date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    wall_s=time.perf_counter() - started, judgments_done=done,
                    judgment_wall_s=dict(log.get("judgment_wall_s", {})))
        recommended = report.recommend(summaries)
        notes = report.probability_notes(summaries)
        result = {"meta": meta, "summaries": summaries, "per_variant": per_variant, "recommended": recommended,
                  "recommended_setting": report.scoring_setting(recommended), "notes": notes,
                  "gaps": [dataclasses.asdict(g) for g in load_gaps()]}
        write_jsonl(out / "rows.jsonl", rows)
        write_json(out / "summary.json", result)
        (out / "table.md").write_text(report.table(summaries) + "\n")
        if args.results_page:
            page = ROOT / args.results_page
            write_figures(page, result)
            page.write_text(report.results_page(result, figures_line(page)))
        return result

    outcome = asyncio.run(run_bench(params, items, judgments, args.modes, log, write))
    result = write(outcome["rows"])
    print(report.table(result["summaries"]))
    print(json.dumps(result["recommended"]), result["recommended_setting"])


if __name__ == "__main__":
    main()
