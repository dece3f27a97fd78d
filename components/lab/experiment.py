"""The lab's experiment: train the nano policy by SFT, run GRPO from it with the exact outcome reward for each of
``lab.seeds``, and write the learning curves to docs/results/lab.md with a plot beside it. Every figure on that
page is an experiment about the mechanism under a known reward, in a fictional world, with a few-million-parameter
policy: never a row of the real-model tables.

    python -m components.lab.experiment sft  --overlay lab      # outputs/lab/sft/ (weights, tokenizer, sft.json)
    python -m components.lab.experiment grpo --overlay lab [--seed 0]  # outputs/lab/grpo_seed0.json and its weights
                                                                       # in grpo_seed0/ (each lab.seeds)
    python -m components.lab.experiment judges --overlay lab    # outputs/lab/judges.json: the dial's agreement
    python -m components.lab.experiment report --overlay lab    # docs/results/lab.md, docs/results/lab_grpo.png
    python -m components.lab.experiment evaluate --overlay lab --model outputs/lab/sft --split train --first 150
                                                                # greedy EM of a saved nano on a slice of a split
                                                                # (--diagnose: answers seen or not, closed-book EM)

Each command reads the params with the ``lab`` overlay (pass ``--overlay lab``) and runs on ``run.torch_threads``
threads (``sft`` on ``lab.sft_threads``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import torch

from components.io import read_json, write_json
from components.lab.dial import dial_table
from components.lab.params import LabParams
from components.lab.policy import (
    NanoPolicy,
    answer_sources,
    closed_book,
    evaluate,
    greedy_trajectories,
    grpo_run,
    grpo_source,
    lab_protocols,
    lab_seed,
    scores,
    sft_corpus,
    train_nano,
)
from components.lab.world import build_lab_world
from components.llm.backends.simulated import Dial
from components.params import Params, RunParams
from components.params_cli import params_from_args, stage_argparser
from components.training.params import GRPOParams
from components.training.prompt_order import PromptSampler

RESULTS = Path("docs/results")


def lab_dir(run: RunParams) -> Path:
    return Path(run.out_dir)


def run_sft(params: Params, seed: int) -> dict:
    started = time.perf_counter()
    corpus = sft_corpus(params)
    data_s = time.perf_counter() - started
    nano = train_nano(params, corpus, seed=seed, progress="nano sft")
    lab = build_lab_world(params, lab_seed(params))
    t0 = time.perf_counter()
    test = evaluate(nano, lab, lab.splits["test"], params.agent)
    protocols = lab_protocols(params.methods)
    others = {f"test_{name}_{k}": v for name in params.lab.sft_protocols if name != "react" for k, v in
              evaluate(nano, lab, lab.splits["test"], params.agent, protocol=protocols[name]).items()}
    info = {**nano.info, "data_s": data_s, "eval_s": time.perf_counter() - t0, "parameters": nano.parameters(),
            "skipped": dict(corpus.counts), "seed": seed, "threads": torch.get_num_threads(),
            "protocols": params.lab.sft_protocols, **{f"test_{k}": v for k, v in test.items()}, **others}
    nano.save(lab_dir(params.run) / "sft")
    write_json(lab_dir(params.run) / "sft" / "sft.json", info)
    return info


def grpo_settings(g: GRPOParams, lab: LabParams) -> dict:
    """What a GRPO run's figures depend on beyond its seed and start, kept in its JSON so the page states how each
    run ran, whatever the params the report reads."""
    return {"steps": lab.grpo_steps, "prompts_per_step": g.prompts_per_step, "group_size": g.group_size, "lr": g.lr,
            "kl_coef": g.kl_coef, "temperature": g.temperature, "grpo_worlds": lab.grpo_worlds}


def run_grpo(params: Params, seed: int) -> dict:
    start = NanoPolicy.load(lab_dir(params.run) / "sft")
    lab = build_lab_world(params, lab_seed(params))
    before = evaluate(start, lab, lab.splits["test"], params.agent)
    # GRPO's own questions that its run never draws (one draw of grpo.prompts_per_step a step, the trainer's order):
    # whether what it learns holds on new questions of the worlds it trains in, beside the lab world's test split
    questions, toolbox = grpo_source(params, lab)
    drawn = set(PromptSampler(len(questions), seed, params.grpo.shuffle).next(
        params.lab.grpo_steps * params.grpo.prompts_per_step))
    unseen, grpo_worlds = [q for i, q in enumerate(questions) if i not in drawn], replace(lab, toolbox=toolbox)
    unseen_before = evaluate(start, grpo_worlds, unseen, params.agent) if unseen else {}
    started, cpu = time.perf_counter(), time.process_time()
    partial = lab_dir(params.run) / f"grpo_seed{seed}.partial.json"
    curve = grpo_run(params, start, lab, seed=seed, source=(questions, toolbox),
                     on_metrics=lambda step, m: print(f"step {step} reward {m.get('reward/mean', float('nan')):.3f}",
                                                       flush=True),
                     on_point=lambda c: write_json(partial, {"seed": seed, "curve": c, **{
                         f"test_before_{k}": v for k, v in before.items()}}))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu  # CPU: the one core's work, load aside
    test = evaluate(start, lab, lab.splits["test"], params.agent)  # start.model was trained in place
    unseen_after = evaluate(start, grpo_worlds, unseen, params.agent) if unseen else {}
    start.save(lab_dir(params.run) / f"grpo_seed{seed}")  # for `evaluate --model` (e.g. --diagnose)
    out = {"seed": seed, "wall_s": wall, "cpu_s": cpu, "settings": grpo_settings(params.grpo, params.lab), "curve": curve,
           **{f"test_before_{k}": v for k, v in before.items()}, **{f"test_{k}": v for k, v in test.items()},
           **{f"unseen_before_{k}": v for k, v in unseen_before.items()},
           **{f"unseen_{k}": v for k, v in unseen_after.items()}}
    write_json(lab_dir(params.run) / f"grpo_seed{seed}.json", out)
    partial.unlink(missing_ok=True)
    return out


DIALS = [Dial(), Dial(flip_rate=0.2), Dial(position_bias=0.5), Dial(bias="length", bias_rate=0.5),
         Dial(bias="keyword", bias_rate=1.0)]


def run_judges(params: Params, n: int = 200) -> list[dict]:
    rows = dial_table(params, DIALS, n=n)
    write_json(lab_dir(params.run) / "judges.json", rows)
    return rows


def _dial_name(r: dict) -> str:
    parts = [f"flip {r['flip_rate']:g}"] + ([f"position {r['position_bias']:g}"] if r["position_bias"] else []) + (
        [f"{r['bias']} bias {r['bias_rate']:g}"] if r["bias"] != "none" else [])
    return ", ".join(parts)


def _plot(runs: list[dict], sft_em: float, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for run in runs:
        steps = [p["step"] for p in run["curve"]]
        done = "test_em" in run
        ax.plot(steps, [p["dev_em"] for p in run["curve"]], marker="o", ms=3,
                label=f"seed {run['seed']}" + ("" if done else f" (to step {int(steps[-1])})"))
    ax.axhline(sft_em, color="grey", ls="--", lw=1, label="SFT start (test)")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("dev EM (greedy)")
    ax.set_title("Lab: nano policy, GRPO with the exact outcome reward")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def head_commit() -> str:
    """The short commit a results page names."""
    import subprocess

    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def _unseen_summary(runs: list[dict]) -> str:
    gains = [r["unseen_em"] - r["unseen_before_em"] for r in runs if "unseen_em" in r]
    if not gains:
        return ""
    return (f" On GRPO's own questions that its run never drew (the worlds it trains in, new questions): mean "
            f"{sum(gains) / len(gains):+.3f} over {len(gains)} seeds.")


def report(params: Params) -> Path:
    sft = read_json(lab_dir(params.run) / "sft" / "sft.json")
    runs = [read_json(p) for p in sorted(lab_dir(params.run).glob("grpo_seed*.json")) if not p.name.endswith(".partial.json")]
    partial = [read_json(p) for p in sorted(lab_dir(params.run).glob("grpo_seed*.partial.json"))]
    RESULTS.mkdir(parents=True, exist_ok=True)
    png = RESULTS / "lab_grpo.png"
    if runs or partial:
        _plot(runs + partial, sft["test_em"], png)
    lines = [
        "# The lab: a nano policy, GRPO with the exact outcome reward",
        "",
        f"Written {time.strftime('%Y-%m-%d')} at commit {head_commit()} by `python -m components.lab.experiment report "
        "--overlay lab` (the SFT and each GRPO run by the `sft` and `grpo` commands of that module). **Lab results**: a "
        f"{sft['parameters'] / 1e6:.2f}M-parameter Qwen2 trained from scratch in a fictional world; they say what the "
        "training mechanism does under a reward of known quality, never how a real model does. Do not mix these "
        "rows into the real-model tables.",
        "",
        "## The nano policy after SFT",
        "",
        f"- size: {sft['parameters']:,} parameters ({params.lab.nano.num_layers} layers, width "
        f"{params.lab.nano.hidden_size}, MLP {params.lab.nano.intermediate_size}, tied embeddings), random init "
        f"(seed {sft['seed']});",
        f"- tokenizer: byte-level BPE fitted to the SFT rows, {sft['vocab']} tokens;",
        f"- data: {sft['episodes']} compact oracle episodes from {params.lab.sft_worlds} other worlds"
        f"{' and the lab world' + chr(39) + 's train split' if params.lab.sft_own_world else ''} "
        f"({sft['rows']} chat rows, mean {sft['row_tokens_mean']:.0f} tokens, longest {sft['row_tokens_max']}); "
        f"built in {sft['data_s']:.0f} s;",
        f"- SFT: {sft['sft_steps']} steps of {params.sft.batch_size} rows, lr {params.sft.lr:g}, "
        f"{sft['sft_s'] / 60:.1f} min on {sft['threads']} thread(s), final loss {sft['final_loss']:.3f};",
        f"- world test split ({int(sft['test_n'])} questions, greedy): EM **{sft['test_em']:.3f}**, F1 "
        f"{sft['test_f1']:.3f}, answered {sft['test_answered']:.2f}, {sft['test_turns']:.1f} turns per episode "
        + ("(within the target 0.2-0.5: room left to learn)." if 0.2 <= sft["test_em"] <= 0.5 else
           "(outside the target 0.2-0.5; docs/lab.md, \"How it got here\")."),
        "",
    ]
    if runs or partial:
        ran = {json.dumps(r.get("settings", grpo_settings(params.grpo, params.lab)), sort_keys=True) for r in runs + partial}
        if len(ran) > 1:
            raise ValueError(f"{lab_dir(params.run)}: its GRPO runs ran under different settings: {sorted(ran)}")
        s = json.loads(ran.pop())
        source = (f"the questions of the SFT's first {s['grpo_worlds']} worlds that it did not read "
                  "(`lab.grpo_worlds`), each served its own world" if s["grpo_worlds"] else
                  "the lab world's train questions")
        lines += [
            "## GRPO from the SFT start",
            "",
            f"{s['steps']} steps of {s['prompts_per_step']} questions x {s['group_size']} attempts on {source}, lr "
            f"{s['lr']:g}, KL {s['kl_coef']:g}, temperature {s['temperature']:g}; reward 1 for an exact-match answer, "
            f"else 0; greedy dev EM on {params.data.n_dev} questions every {params.lab.eval_every} steps.",
            "",
            "![learning curves](lab_grpo.png)",
            "",
            "| seed | dev EM at 0 | dev EM at end | best dev EM | test EM before | test EM after | GRPO's questions never "
            "drawn: EM before -> after | wall (min) | CPU (min) | rollout / update (s) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in runs:
            c = r["curve"]
            unseen = (f"{r['unseen_before_em']:.3f} -> {r['unseen_em']:.3f} ({int(r['unseen_n'])})"
                      if "unseen_em" in r else "-")
            lines.append(f"| {r['seed']} | {c[0]['dev_em']:.3f} | {c[-1]['dev_em']:.3f} | "
                         f"{max(p['dev_em'] for p in c):.3f} | {r['test_before_em']:.3f} | {r['test_em']:.3f} | "
                         f"{unseen} | {r['wall_s'] / 60:.1f} | {r.get('cpu_s', math.nan) / 60:.1f} | "
                         f"{c[-1].get('time/rollout', math.nan):.0f} / {c[-1].get('time/update', math.nan):.0f} |")
        for r in partial:
            c = r["curve"]
            lines.append(f"| {r['seed']} (stopped at step {int(c[-1]['step'])}) | {c[0]['dev_em']:.3f} | "
                         f"{c[-1]['dev_em']:.3f} | {max(p['dev_em'] for p in c):.3f} | {r['test_before_em']:.3f} | - | - | "
                         f"{c[-1]['wall_s'] / 60:.1f} | - | {c[-1].get('time/rollout', math.nan):.0f} / "
                         f"{c[-1].get('time/update', math.nan):.0f} |")
        gains = [r["test_em"] - r["test_before_em"] for r in runs] or [math.nan]
        mean = sum(gains) / len(gains)
        sd = (sum((x - mean) ** 2 for x in gains) / max(len(gains) - 1, 1)) ** 0.5
        lines += ["", f"Test EM change against the SFT start: mean {mean:+.3f} (sd {sd:.3f} over {len(runs)} seeds; "
                  f"{int(sft['test_n'])} test questions each).{_unseen_summary(runs)} Dev EM is over {params.data.n_dev} questions: 0.02 is "
                  "one answer. Wall minutes are on a 2-core machine shared with other jobs; CPU minutes are the one "
                  "thread's work. Rollout and update seconds are wall time summed over the run (the rest is the dev "
                  "evaluations).", ""]
    judges = lab_dir(params.run) / "judges.json"
    rows = read_json(judges) if judges.exists() else []
    if rows:
        dials = list(dict.fromkeys(_dial_name(r) for r in rows))
        cell = {(r["kind"], _dial_name(r)): r for r in rows}
        lines += ["## The simulated judge against the oracle", "",
                  f"Each kind asked {rows[0]['n']} judgments through its method's own prompt and parser "
                  "(`python -m components.lab.experiment judges`): compact oracle episodes and the same episodes cut "
                  "after their first turn, correct answers in other words and other questions' answers, the oracle's "
                  "own next action and a search for another question's entity. A cell is the agreement with the "
                  "oracle's verdict over the counted verdicts (one reply may hold several; what a verdict is, per "
                  "kind, in the last column); the flip-0.2 column carries its 95% Clopper-Pearson interval.", "",
                  "| kind | verdicts | " + " | ".join(dials) + " | failed | a verdict is |",
                  "|---" * (len(dials) + 4) + "|"]
        for kind in dict.fromkeys(r["kind"] for r in rows):
            parts = []
            for d in dials:
                r = cell.get((kind, d))
                parts.append("-" if r is None else f"{r['agreement']:.3f}" + (
                    f" [{r['low']:.2f}, {r['high']:.2f}]" if d == "flip 0.2" else ""))
            first = cell[(kind, dials[0])]
            failed = sum(cell[(kind, d)]["failed"] for d in dials if (kind, d) in cell)
            lines.append(f"| {kind} | {first.get('verdicts', first['n'])} | " + " | ".join(parts) +
                         f" | {failed} | {first.get('measure', '')} |")
        lines.append("")
    lines += [f"Every figure above is in `{RESULTS.as_posix()}/lab.json` (the SFT's record, each run's JSON with its curve, "
              "the judge rows), written beside this page.", ""]
    write_json(RESULTS / "lab.json", {"sft": sft, "runs": runs, "partial": partial,
                                      "judges": rows})
    (RESULTS / "lab.md").write_text("\n".join(lines) + "\n")
    return RESULTS / "lab.md"


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("command", choices=["sft", "grpo", "judges", "report", "evaluate"])
    parser.add_argument("--model", type=Path, action="append", help="evaluate: a saved nano's folder (repeatable)")
    parser.add_argument("--split", default="test", choices=["train", "dev", "test"], help="evaluate: the split")
    parser.add_argument("--first", type=int, default=0, help="evaluate: the slice's first question")
    parser.add_argument("--n", type=int, default=None, help="evaluate: its length (default: to the split's end)")
    parser.add_argument("--diagnose", action="store_true", help="evaluate: where the answers come from "
                        "(answer_sources) and EM with every question scoped to another's paragraphs (closed_book)")
    parser.add_argument("--seed", type=int, default=None, help="sft: the init seed (0); grpo: one run (default: "
                        "one per lab.seeds)")
    args = parser.parse_args()
    params = params_from_args(args)
    threads = (params.lab.sft_threads if args.command == "sft" else None) or params.run.torch_threads
    if threads:
        torch.set_num_threads(threads)
    if args.command == "sft":
        print(json.dumps(run_sft(params, args.seed or 0), indent=1))
    elif args.command == "grpo":
        for seed in params.lab.seeds if args.seed is None else [args.seed]:
            out = run_grpo(params, seed)
            print(json.dumps({k: v for k, v in out.items() if k != "curve"}, indent=1))
    elif args.command == "judges":
        for row in run_judges(params):
            print(row["kind"], _dial_name(row), f"{row['agreement']:.3f}")
    elif args.command == "evaluate":
        lab = build_lab_world(params, lab_seed(params))
        questions = lab.splits[args.split][args.first:None if args.n is None else args.first + args.n]
        for folder in args.model or [lab_dir(params.run) / "sft"]:
            nano = NanoPolicy.load(folder)
            trajectories = greedy_trajectories(nano, lab, questions, params.agent)
            out = scores(trajectories, questions)
            if args.diagnose:
                out |= answer_sources(trajectories, questions)
                out["closed_book_em"] = evaluate(nano, lab, closed_book(questions), params.agent)["em"]
            print(folder, json.dumps(out))
    else:
        print(report(params))


if __name__ == "__main__":
    main()
