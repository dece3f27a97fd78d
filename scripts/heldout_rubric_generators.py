"""Held-out Spearman of trained rubric generators on questions none of them was trained on: the untrained base and
each given LoRA adapter write rubrics (greedy plus ``rubric_generator.heldout_samples`` sampled) for every usable
branching point of this run's collect whose question is not in ``--exclude-questions-of`` (the collect the adapters
were trained on), scored by the listwise reward exactly as ``train_rubric_generator`` measures its held-out split.

    python scripts/heldout_rubric_generators.py --set run.out_dir=/tmp/big \
        --exclude-questions-of /tmp/small/collect/branching_points.parquet \
        --adapter criterion=/tmp/small/train_rubric_generator/listwise/adapter [--adapter NAME=PATH ...]

A larger collect whose first questions are a smaller one's (``collect.n_questions`` raised, the same seed) gives
held-out questions for generators trained on the smaller one. Each adapter is compared with the untrained base
point by point (:func:`~components.methods.coreact.rubric_training.paired_change`, over the evaluated rubrics and with an
unparseable rubric counted as rho 0). The gold-chain rubric of each point
(:func:`~components.methods.coreact.oracle_rubrics.oracle_rubric`) is scored too: how much room the points leave (a flat gold rubric means
the evaluator cannot rank that slate by the next hop). Rollouts use the trained role's llama.cpp engine, as in
training. Writes outputs/probe/heldout_generators.json and prints a table.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.io import read_parquet, write_json
from components.judges.call import Tally
from components.llm.factory import LLMPool
from components.methods.coreact.generator_reward import RubricReward, evaluator_model
from components.methods.coreact.generator_training import questions_by_id
from components.methods.coreact.oracle_rubrics import oracle_rubric
from components.methods.coreact.rubric_training import (
    held_out_spearman,
    paired_change,
    prompt_items,
    usable_points,
)
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.run_files import out_path
from components.schemas import BranchingPoint

_spec = importlib.util.spec_from_file_location("probe_rubric_evaluator", Path(__file__).with_name("probe_rubric_evaluator.py"))
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def held_out_points(points: list[BranchingPoint], exclude: list[BranchingPoint]) -> list[BranchingPoint]:
    """The usable points whose question is not among ``exclude``'s questions."""
    seen = {p.question_id for p in exclude}
    return [p for p in usable_points(points)[0] if p.question_id not in seen]


def adapter_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--adapter wants NAME=PATH, got {text!r}")
    if not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"--adapter {name}: {path} is not a peft adapter folder")
    return name, Path(path)


def gold_scores(params: Params, points: list[BranchingPoint], scorer: RubricReward) -> dict:
    """The gold-chain rubric of every point, summarised as the probe does, with its agreeing and disagreeing points."""
    questions, tally = questions_by_id(params.run), Tally()

    async def every():
        return await asyncio.gather(*(scorer.score(p, oracle_rubric(p, questions[p.question_id]), tally=tally)
                                      for p in points))

    parts = asyncio.run(every())
    rhos = [p.rho for p in parts if p is not None and p.rho is not None]
    return {**probe.summary(parts, tally), "positive": float(sum(r > 0 for r in rhos)),
            "negative": float(sum(r < 0 for r in rhos))}


def run(params: Params, points: list[BranchingPoint], adapters: list[tuple[str, Path]]) -> dict:
    from components.embedded.lora_gguf import ensure_lora_gguf
    from components.embedded.models import load_hf_tokenizer
    from components.run_spec import run_spec
    from components.training.engines.llamacpp import engine_for_policy
    from components.training.grpo.agent_rollout import chat_template_renderer

    s, obs = params.rubric_generator, params.coreact.observation_chars
    tokenizer = load_hf_tokenizer(params.llm.backends[params.llm.roles["trainable_policy"]].embedded,
                                  params.run.cache_dir)
    items = prompt_items(points, chat_template_renderer(tokenizer), s.max_criteria, obs, max_chars=s.max_criterion_chars)
    sampling = {"samples": s.heldout_samples, "temperature": s.temperature, "top_p": s.top_p}
    result: dict = {"points": len(points), "questions": len({p.question_id for p in points}),
                    "evaluator_mode": s.evaluator_mode, "generators": {}, "change": {},
                    "change_unparsed_as_chance": {}}
    with LLMPool(params) as pool:
        scorer = RubricReward(evaluator_model(pool.role, s), s, seed=params.seed, observation_chars=obs)
        result["gold"] = gold_scores(params, points, scorer)
        engine = engine_for_policy(run_spec(params), None, tokenizer)
        try:
            for name, adapter in [("untrained", None), *adapters]:
                engine.load_adapter(None if adapter is None else ensure_lora_gguf(adapter, params.run.cache_dir))
                summary, rubrics = held_out_spearman(engine, items, scorer, s.max_tokens, **sampling)
                result["generators"][name] = {"adapter": None if adapter is None else str(adapter),
                                              "summary": summary, "rubrics": rubrics}
                if adapter is not None:
                    base = result["generators"]["untrained"]["rubrics"]
                    result["change"][name] = paired_change(base, rubrics, seed=params.seed)
                    result["change_unparsed_as_chance"][name] = paired_change(base, rubrics, seed=params.seed,
                                                                              unparsed_as_chance=True)
        finally:
            engine.close()
    return result


def table(result: dict) -> str:
    """The script's printed tables: each generator's parse rate, rho and flat rate, and each change vs untrained
    (greedy / sampled; "-" for sampled figures when ``heldout_samples`` is 0)."""
    lines = ["rho: mean over the evaluated rubrics; 'as chance': an unparseable rubric counted as rho 0",
             "| generator | parse rate greedy / sampled | rho greedy / sampled | as chance greedy / sampled | flat rate |",
             "|---|---|---|---|---|"]

    def both(m: dict, key: str, form: str) -> str:
        return " / ".join(format(m[k], form) if k in m else "-" for k in (key, f"sampled_{key}"))

    for name, g in result["generators"].items():
        m = g["summary"]
        lines.append(f"| {name} | {both(m, 'parse_rate', '.2f')} | {both(m, 'spearman', '+.3f')} | "
                     f"{both(m, 'spearman_with_unparsed', '+.3f')} | {m['flat_rate']:.2f} |")
    lines += ["| change vs untrained | view | delta [95% CI] | Wilcoxon p | points up / down / same |", "|---|---|---|---|---|"]
    for view in ("change", "change_unparsed_as_chance"):
        for name, c in result[view].items():
            lines.append(f"| {name} | {view} | {c['delta_mean']:+.3f} [{c['delta_ci_low']:+.2f}, {c['delta_ci_high']:+.2f}] | "
                         f"{c['wilcoxon_p']:.2f} | {c['points_up']:.0f} / {c['points_down']:.0f} / {c['points_same']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--exclude-questions-of", type=Path, required=True,
                        help="branching_points.parquet of the collect the adapters were trained on")
    parser.add_argument("--adapter", type=adapter_arg, action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--max-points", type=int, default=None, help="the first N held-out points only (a smoke run)")
    args = parser.parse_args()
    params = params_from_args(args)
    points = held_out_points(read_parquet(out_path(params.run, "collect", "branching_points.parquet"), BranchingPoint),
                             read_parquet(args.exclude_questions_of, BranchingPoint))[: args.max_points]
    if not points:
        raise SystemExit(f"no usable branching point outside the questions of {args.exclude_questions_of}")
    result = run(params, points, args.adapter)
    write_json(out_path(params.run, "probe", "heldout_generators.json"), result)
    print(f"{result['points']} held-out points from {result['questions']} questions; gold rubric: {result['gold']}")
    print(table(result))


if __name__ == "__main__":
    main()
