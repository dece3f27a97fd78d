"""Does a greedy dev evaluation give the same answers twice? Batched vs batch-invariant serving, side by side.

Run after the ``sft`` stage (the main job's warm start; ``--agent scaffold`` after ``sft_scaffold``); with the
defaults 31.5 minutes on 2 busy cores (2026-11-29). 5 questions x 2 repeats once saw no flip where 20 x 3 saw three::

    python perf/eval_determinism.py [--agent react] [--questions 20] [--repeats 3] \
        [--set train_policy.n_ctx=4096] [--out perf/results/eval_determinism.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json
import tempfile
import time
from pathlib import Path

from components.agents.react import build_agent
from components.io import read_jsonl, write_json
from components.params_cli import params_from_args, stage_argparser
from components.policy_run import dev_evaluation, make_engine
from components.retrieval.run_index import load_toolbox
from components.run_files import out_path
from components.run_spec import run_spec
from components.schemas import Question
from components.training.grpo.agent_rollout import make_agent_rollout
from components.training.warm_started import warm_start_adapter, warm_start_options, warm_started_policy

RESULTS = Path(__file__).parent / "results" / "eval_determinism.json"


def main() -> None:
    """How it measures, and what it writes.

    ``train_policy`` measures ``dev_before`` / ``dev_after`` with greedy episodes on the rollout engine. Batched,
    the native llama-server decodes the episodes' turns together, and which requests share a batch (and which
    prompt a slot had cached) moves the quantized kernels' results enough to flip greedy near-ties: the same
    warm start scored EM 0.0 and 0.2 on the same 5 questions in two runs. ``engine.batch_invariant()`` sends
    one request at a time with no cached prompt. This script runs the same evaluation ``--repeats`` times in
    each mode, interleaved (batched, invariant, batched, ...) so every invariant repeat starts from different
    server state, and reports per mode the scores of each repeat, how many distinct answer lists the repeats
    gave, how many questions ever changed answer, and the wall time (invariant / batched as a ratio).

    The policy is the agent's warm start (``train_policy.warm_start``) served by ``train_policy.engine`` exactly
    as ``train_policy`` serves it (:func:`components.policy_run.make_engine`), on the first ``--questions`` dev questions.
    """
    parser = stage_argparser(__doc__)
    parser.add_argument("--agent", default="react", help="agent registry name (its warm start is served)")
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    params = params_from_args(args)

    questions = read_jsonl(out_path(params.run, "data", "dev.jsonl"), Question)[: args.questions]
    toolbox = load_toolbox(params.run, params.retrieval, params.agent.observation_max_chars)
    spec = run_spec(params)
    policy, tokenizer = warm_started_policy(spec, args.agent)
    warm = warm_start_adapter(spec, args.agent)
    engine = make_engine(spec, policy, tokenizer, [warm] if warm is not None else [])
    options = warm_start_options(spec, args.agent)
    rollout_fn = make_agent_rollout(
        lambda p: build_agent(args.agent, lambda role: p, toolbox, params.agent, options), tokenizer)

    runs: dict[str, list[dict]] = {"batched": [], "invariant": []}
    scratch = Path(tempfile.mkdtemp(prefix="eval-determinism-"))
    try:
        for r in range(args.repeats):
            for mode, reps in runs.items():
                path = scratch / f"{mode}_{r}.jsonl"
                t0 = time.perf_counter()
                metrics = dev_evaluation(rollout_fn, engine, questions, params.grpo.max_new_tokens, path,
                                         batch_invariant=mode == "invariant")
                wall = time.perf_counter() - t0
                answers = [json.loads(line).get("final_answer") for line in path.read_text().splitlines()]
                reps.append({"wall_s": round(wall, 1), "answers": answers,
                                   **{k: round(v, 4) for k, v in metrics.items()}})
                print(f"{mode:9s} repeat {r}: EM {metrics['em']:.2f} F1 {metrics['f1']:.2f} "
                      f"answered {metrics['answered']:.2f} in {wall:.0f} s", flush=True)
    finally:
        engine.close()

    summary = {}
    for mode, reps in runs.items():
        answer_lists = [tuple(map(str, rep["answers"])) for rep in reps]
        changed = sum(len({a[i] for a in answer_lists}) > 1 for i in range(len(questions)))
        summary[mode] = {"distinct_answer_lists": len(set(answer_lists)), "questions_changed": changed,
                         "em": [rep["em"] for rep in reps], "f1": [rep["f1"] for rep in reps],
                         "mean_wall_s": round(sum(rep["wall_s"] for rep in reps) / len(reps), 1)}
    ratio = summary["invariant"]["mean_wall_s"] / max(summary["batched"]["mean_wall_s"], 1e-9)

    print(f"\n{len(questions)} dev questions, {args.repeats} repeats per mode, agent {args.agent}, "
          f"engine {params.train_policy.engine}")
    print(f"{'mode':10s} {'distinct answer lists':>22s} {'questions changed':>18s} {'EM per repeat':>16s} "
          f"{'mean wall s':>12s}")
    for mode, s in summary.items():
        print(f"{mode:10s} {s['distinct_answer_lists']:>22d} {s['questions_changed']:>18d} "
              f"{' '.join(f'{e:.2f}' for e in s['em']):>16s} {s['mean_wall_s']:>12.1f}")
    print(f"invariant / batched wall time: {ratio:.2f}x")

    write_json(args.out, {
        "agent": args.agent, "engine": params.train_policy.engine, "questions": [q.id for q in questions],
        "repeats": args.repeats, "summary": summary, "invariant_over_batched_wall": round(ratio, 3),
        "runs": runs, "loadavg": os.getloadavg(), "cpus": os.cpu_count(),
    }, sort_keys=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
