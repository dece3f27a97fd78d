"""Judge bench: how well the answer judge and ARBOR's pairwise judge agree with the embedded world's oracle, in
text scoring and in probability scoring, on the real judge model.

    .venv/bin/python scripts/judge_bench.py [--questions 8] [--world-seed 7] [--out outputs/judge_bench]
                                            [--modes text probability] [--cache] [--set ...]

Builds the fixed trajectory set (:mod:`components.judges.bench.trajectories`: gold trajectories of N world
questions and their perturbations, with oracle labels), writes it as JSONL with its digest, then asks:

- the answer judge (:func:`components.judges.answer.judge_answer`, role ``answer_judge``) about answers string
  matching cannot decide: the gold answer in a sentence (right), and a wrong answer of the same kind and an
  intermediate hop's answer (wrong);
- ARBOR's pairwise judge (its prompt, parser and choice from ``components.methods.arbor.pairwise_judge``, role
  ``arbor.judge_role``) about each pair (gold, perturbed) in both orders, on a rubric about finding each hop.

Each judgment is asked once per mode: ``text`` is the params as given, ``probability`` the same params with
``llm.scoring`` set to ``probability`` for the two roles (set here in code; params.yaml is not touched). Both
modes share one backend (the probability pool gets the text pool's backend as an override), and the two modes
of one prompt are asked back to back (the server's prompt cache serves the second), each mode first for every
other prompt, so that neither mode's seconds gain more from that cache; ``s / judgment (cold)`` is over the
judgments asked first. The response cache is off
unless ``--cache`` (a replay would make the seconds meaningless).

Writes under ``--out``: ``trajectories.jsonl`` (+ manifest), ``rows.jsonl`` (every judgment), ``summary.json``,
``table.md``; and rewrites ``--results-page`` (default docs/results/judges_bench.md) from the summary.

This is a script rather than a module of components.judges because it drives a method's judge, and shared code
may not import a method package; it imports components only (never tasks or flows).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.evaluation.metrics import exact_match, normalize_answer
from components.io import write_json, write_jsonl
from components.judges.answer import judge_answer
from components.judges.bench import metrics, report
from components.judges.bench.trajectories import SET_VERSION, build_set, pairs, write_set
from components.judges.call import JudgeCall, Tally, ask
from components.judges.render import trajectory_text
from components.llm.base import Sampling
from components.llm.factory import LLMPool
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_judge import WINNER, WINNER_SCHEMA, judge_messages, parse_winner
from components.params_cli import params_from_args, stage_argparser
from components.retrieval.bm25 import BM25Index
from components.retrieval.scope import world_question_paragraphs
from components.retrieval.tools import make_toolbox
from components.world import generate_world

ROOT = Path(__file__).resolve().parents[1]
RUBRIC = RubricText(
    title="Finds each hop",
    description="Looks up each entity of the question's chain in turn, reads every fact the answer depends on in "
                "a retrieved paragraph, and answers with what those facts give.",
    counter_description="Skips an entity of the chain, answers without having read a fact it depends on, or stops "
                        "before reaching the answer.")


def answer_items(items) -> list[dict]:
    """Per question: the gold answer in two sentences (right), the wrong answer of the set and an intermediate
    hop's answer (wrong); none of them an exact match, so each needs the judge."""
    out, seen = [], set()
    for it in items:
        q = it.question
        if it.variant == "gold":
            gold = q.answers[0]
            candidates = [(f"I believe it is {gold}", True), (f"{gold}, according to the search results", True)]
            hops = [h.answer for h in q.gold_chain[:-1]
                    if not exact_match(h.answer, q.answers) and normalize_answer(h.answer) not in ("yes", "no")]
            if hops:
                candidates.append((hops[-1], False))
        elif it.variant == "wrong_answer":
            candidates = [(it.trajectory.final_answer, False)]
        else:
            continue
        for prediction, label in candidates:
            if (exact_match(prediction, q.answers) and not label) or (q.id, prediction) in seen:
                continue
            seen.add((q.id, prediction))
            out.append({"question": q, "prediction": prediction, "label": label,
                        "kind": "paraphrase" if label else ("hop_answer" if it.variant == "gold" else "wrong_answer")})
    return out


async def ask_answer(model, item: dict) -> dict:
    tally = Tally()
    start = time.perf_counter()
    verdict = await judge_answer(model, item["question"], item["prediction"], tally)
    seconds = time.perf_counter() - start
    return {"verdict": None if verdict is None else float(verdict), "calls": tally.calls, "seconds": seconds,
            "prompt_tokens": tally.prompt_tokens, "completion_tokens": tally.completion_tokens,
            "failed": tally.failed, "scored_from_probability": tally.scored_from_probability}


async def ask_pair(model, question: str, text_a: str, text_b: str, max_tokens: int) -> dict:
    tally = Tally()
    call = JudgeCall(judge_messages(question, text_a, text_b, RUBRIC), parse_winner,
                     Sampling(temperature=0.0, max_tokens=max_tokens), schema=WINNER_SCHEMA, choice=WINNER)
    start = time.perf_counter()
    result = await ask(model, call, tally)
    seconds = time.perf_counter() - start
    row = {"calls": tally.calls, "seconds": seconds, "prompt_tokens": tally.prompt_tokens,
           "completion_tokens": tally.completion_tokens, "scored_from_probability": tally.scored_from_probability}
    if result.ok:
        row.update(winner=result.value, expected=result.expected, label_probs=dict(result.label_probs or {}) or None,
                   failure=None)
    else:
        row.update(winner=None, expected=None, label_probs=None, failure=result.kind)
    return row


def alternate(modes: list[str], n: int) -> list[str]:
    """The modes in which to ask the ``n``-th prompt: every other prompt reversed, so that each mode is asked
    first (with a cold server prompt cache) half of the time."""
    return list(modes) if n % 2 == 0 else list(reversed(modes))


def with_llm(params, **update):
    return params.model_copy(update={"llm": params.llm.model_copy(update=update)})


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


async def run_bench(params, items, modes, log) -> tuple[list[dict], list[dict], dict]:
    answer_role, pair_role = "answer_judge", params.arbor.judge_role
    base = with_llm(params, middleware=params.llm.middleware.model_copy(update={"cache": log["cache"]}))
    text_pool = LLMPool(base)
    backends = {params.llm.roles[answer_role], params.llm.roles[pair_role]}
    prob_params = with_llm(base, scoring={**base.llm.scoring, answer_role: "probability", pair_role: "probability"})
    prob_pool = LLMPool(prob_params, overrides={b: text_pool.backend(b) for b in backends},
                        cache_path=Path(params.run.cache_dir) / "llm_responses.sqlite")
    pools = {"text": text_pool, "probability": prob_pool}
    judges = {m: (pools[m].role(answer_role), pools[m].role(pair_role)) for m in modes}
    answer_rows, pair_rows = [], []
    try:
        for n, item in enumerate(answer_items(items)):
            for k, mode in enumerate(alternate(modes, n)):
                row = await ask_answer(judges[mode][0], item)
                answer_rows.append({"judgment": "answer_judge", "mode": mode, "question_id": item["question"].id,
                                    "prediction": item["prediction"], "kind": item["kind"], "label": item["label"],
                                    "asked_first": k == 0, **row})
            print(f"answer {n + 1}: {answer_rows[-1]['seconds']:.1f}s", flush=True)
        obs = params.arbor.observation_chars
        for n, (gold, other, preferred) in enumerate(pairs(items)):
            texts = {"gold": trajectory_text(gold.trajectory, obs), "other": trajectory_text(other.trajectory, obs)}
            pair_id = f"{gold.question.id}:{other.variant}"
            for o, order in enumerate(("AB", "BA")):
                a, b = ("gold", "other") if order == "AB" else ("other", "gold")
                shown = preferred if order == "AB" or preferred is None else {"A": "B", "B": "A"}[preferred]
                for k, mode in enumerate(alternate(modes, n + o)):
                    row = await ask_pair(judges[mode][1], gold.question.question, texts[a], texts[b],
                                         params.arbor.judge_max_tokens)
                    pair_rows.append({"judgment": "arbor_pairwise", "mode": mode, "pair": pair_id,
                                      "variant": other.variant, "order": order, "preferred": shown,
                                      "asked_first": k == 0, **row})
            print(f"pair {n + 1}: {pair_rows[-1]['seconds']:.1f}s {pair_rows[-1]['prompt_tokens']} tok", flush=True)
        accounting = {m: pools[m].accounting.metrics() for m in modes}
    finally:
        prob_pool.close()
        text_pool.close()
    roles = {"answer_judge": answer_role, "arbor_pairwise": pair_role}
    return answer_rows, pair_rows, {"accounting": accounting, "roles": roles}


def summarise(answer_rows, pair_rows, modes, seed, roles) -> tuple[list[dict], dict, list[str]]:
    summaries = []
    for judgment, rows, summary in (("answer_judge", answer_rows, metrics.answer_summary),
                                    ("arbor_pairwise", pair_rows, metrics.pairwise_summary)):
        for mode in modes:
            mine = [r for r in rows if r["mode"] == mode]
            s = {"judgment": judgment, "mode": mode, "role": roles[judgment], **summary(mine, seed),
                 **metrics.cost_summary(mine),
                 "scored_from_probability": sum(r["scored_from_probability"] for r in mine)}
            summaries.append(s)
    variants = list(dict.fromkeys(r["variant"] for r in pair_rows))
    per_variant = {}
    for mode in modes:
        cells = {}
        for v in variants:
            rows = [r for r in pair_rows if r["mode"] == mode and r["variant"] == v and r["winner"] is not None]
            decided = [r for r in rows if r["preferred"] is not None]
            ties = sum(r["winner"] == "TIE" for r in rows)
            acc = f"acc {sum(r['winner'] == r['preferred'] for r in decided) / len(decided):.2f}, " if decided \
                else "no oracle preference, "
            cells[v] = f"{acc}TIE {ties / len(rows):.2f} (n={len(rows)})" if rows else "-"
        per_variant[mode] = cells
    return summaries, per_variant, variants


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--questions", type=int, default=8, help="world questions in the trajectory set")
    parser.add_argument("--world-seed", type=int, default=7, help="seed of the bench's world and perturbations")
    parser.add_argument("--out", default="outputs/judge_bench", help="folder of the bench's outputs")
    parser.add_argument("--modes", nargs="+", default=["text", "probability"], choices=["text", "probability"])
    parser.add_argument("--cache", action="store_true", help="use the response cache (replays: seconds mean nothing)")
    parser.add_argument("--results-page", default="docs/results/judges_bench.md",
                        help="the results page to rewrite ('' for none)")
    parser.add_argument("--bootstrap-seed", type=int, default=0)
    args = parser.parse_args()
    params = params_from_args(args)
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

    answer_rows, pair_rows, extra = asyncio.run(run_bench(params, items, args.modes, {"cache": args.cache}))
    summaries, per_variant, variants = summarise(answer_rows, pair_rows, args.modes, args.bootstrap_seed,
                                                 extra["roles"])
    all_pairs = pairs(items)
    backend = params.llm.backends[params.llm.roles["answer_judge"]]
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": git("rev-parse", "--short", "HEAD"), "git_dirty": bool(git("status", "--porcelain", "--",
                                                                                 "components/judges", "scripts")),
        "command": ".venv/bin/python " + " ".join(["scripts/judge_bench.py", *sys.argv[1:]]),
        "judge_model": f"{backend.model} ({backend.type}{', llama.cpp server' if backend.embedded else ''})",
        "device": "CPU, 2 cores shared with other work",
        "set_version": SET_VERSION, "set_sha256": digest, "world_seed": args.world_seed, "cache": args.cache,
        "rubric": RUBRIC.model_dump(), "wall_s": time.perf_counter() - started,
        "sizes": {"questions": sum(i.variant == "gold" for i in items), "trajectories": len(items),
                  "variants": {v: sum(i.variant == v for i in items) for v in dict.fromkeys(i.variant for i in items)},
                  "answer_items": len(answer_rows) // len(args.modes),
                  "answer_positive": sum(r["label"] for r in answer_rows) // len(args.modes),
                  "answer_negative": sum(not r["label"] for r in answer_rows) // len(args.modes),
                  "pairs": len(all_pairs), "pairs_with_preference": sum(p is not None for *_, p in all_pairs)},
    }
    recommended = report.recommend(summaries)
    notes = []
    for s in summaries:
        if s["mode"] == "probability" and s["rows"] and s["scored_from_probability"] < s["rows"] - s["failure_rate"] * s["rows"]:
            notes.append(f"{s['judgment']}, probability mode: {s['scored_from_probability']} of {s['rows']} verdicts "
                         "were read from probabilities; the rest fell back to the sampled label.")
    result = {"meta": meta, "summaries": summaries, "per_variant": per_variant, "per_variant_columns": variants,
              "recommended": recommended, "recommended_setting": report.scoring_setting(recommended),
              "accounting": extra["accounting"], "notes": notes}
    write_jsonl(out / "rows.jsonl", [*answer_rows, *pair_rows])
    write_json(out / "summary.json", result)
    (out / "table.md").write_text(report.table(summaries) + "\n")
    if args.results_page:
        page = ROOT / args.results_page
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(report.results_page(result))
    print(report.table(summaries))
    print(json.dumps(recommended), report.scoring_setting(recommended))


if __name__ == "__main__":
    main()
