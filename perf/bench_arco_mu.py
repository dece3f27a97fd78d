"""ARCO's rubric model mu in each speed mode against the first: warm-up, scoring and writing criteria. Side by
side in one process: its warm-up (with the teacher's annotations, 2,690 s of a 61-minute 2-step ARCO run;
docs/results/method_health.md), scoring the same steps, and writing criteria with its generation head, and what
each option changes in the numbers.

Run (about 27 minutes on 2 cores at the defaults; the ``sft_data`` stage's trajectories and the embedded 0.5B present)::

    python perf/bench_arco_mu.py [--modes fp32 fused int8+fused] [--trajectories 4] [--write-steps 4] \
        [--repeats 2] [--out perf/results/arco_mu.json]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from perf.bench_grpo_step import _reset_peak_rss, _rss_mib
from perf.bench_int8_base import run_record, trainer_params

RESULTS = Path(__file__).parent / "results" / "arco_mu.json"
PHASES = ("warmup_s", "score_s", "write_s")
PARTS = ("fused", "int8", "padded", "grouped", "recompute", "kept")


def mode_name(text: str) -> str:
    """``fp32`` or ``+``-joined :data:`PARTS` and ``KEY=VALUE`` (an ``arco`` key); argparse's type for ``--modes``."""
    from components.methods.arco.params import ArcoParams

    parts = text.split("+")
    named = [p for p in parts if "=" not in p]
    keys = [p.split("=", 1)[0] for p in parts if "=" in p]
    if text != "fp32" and (not set(named) <= set(PARTS) or len(set(parts)) != len(parts)
                           or {"recompute", "kept"} <= set(parts) or not set(keys) <= set(ArcoParams.model_fields)):
        raise argparse.ArgumentTypeError(f"{text!r}: fp32, or parts joined by + of {', '.join(PARTS)} and "
                                         "KEY=VALUE for arco keys")
    return text


def mode_params(params: Any, mode: str) -> Any:
    """params.yaml with ``mode``'s ``arco`` options (padded, grouped, recompute, kept, KEY=VALUE) applied, validated."""
    import yaml

    parts = set(mode.split("+"))
    update = {key: yaml.safe_load(value) for key, value in (p.split("=", 1) for p in parts if "=" in p)}
    if "padded" in parts:
        update["micro_batch_tokens"] = None
    if parts & {"padded", "grouped"}:
        update["prefix_packing"] = False
    if "recompute" in parts:
        update["checkpoint_min_tokens"] = 0
    if "kept" in parts:
        update["checkpoint_min_tokens"] = 1 << 40
    arco = type(params.arco).model_validate({**params.arco.model_dump(), **update})
    return params.model_copy(update={"arco": arco})


@contextmanager
def peak_above_start() -> Iterator[dict[str, float | None]]:
    """After the block, ``["mib"]`` is the process's peak resident memory during it above its memory at the start
    (Linux: the high-water mark reset first; None elsewhere)."""
    start, exact = _rss_mib("VmRSS"), _reset_peak_rss()
    out: dict[str, float | None] = {"mib": None}
    yield out
    peak = _rss_mib("VmHWM") if exact else None
    out["mib"] = None if peak is None or start is None else peak - start


def step_criteria(step: Any) -> list[str]:
    """Three criteria for one step, written from the step (the teacher's stand-in for timing)."""
    if step.finish:
        first = f"Answers with {step.action.removeprefix('finish[').rstrip(']') or 'a name'} only once the results name it"
    else:
        first = f"Searches for {step.query or 'the entity the question needs next'} rather than a broader phrase"
    return [first, "Reuses a name an earlier result gave instead of guessing a new one",
            "Does not repeat a search that already returned the same paragraphs"]


def annotations(params: Any, n: int) -> list[Any]:
    """The first ``n`` teacher trajectories of the sft_data stage (training questions), with criteria per step."""
    from components.io import read_jsonl
    from components.methods.arco.criteria import Annotation, trajectory_steps
    from components.run_spec import run_spec
    from components.schemas import Question, Trajectory

    path = run_spec(params).warm_start_folder("sft_data", params.train_policy.warm_start["react"]) / "trajectories.jsonl"
    out = []
    for t in read_jsonl(path, Trajectory)[:n]:
        question = Question(id=t.question_id, question=t.question, answers=t.metadata["answers"], source="world",
                            split="train")
        out.append(Annotation(question, t, [step_criteria(s) for s in trajectory_steps(t)]))
    return out


def one_mode(params: Any, mode: str, notes: list[Any], write_steps: int, epochs: int) -> dict[str, Any]:
    """Build mu in ``mode``, warm it up on ``notes``, score the warm-up samples, write criteria; times and outputs."""
    from components.methods.arco.criteria import step_messages, trajectory_steps, warmup_rows
    from components.methods.arco.rubric_model import ADAPTER
    from components.methods.arco.variants import ArcoState, build_mu
    from components.run_spec import run_spec

    params = mode_params(params, mode)
    parts = set(mode.split("+"))
    s = params.arco.model_copy(update={"warmup_epochs": epochs})
    spec = run_spec(params)
    state = ArcoState(s, lambda: build_mu(spec, params.arco, int8_base="int8" in parts, fused_lora="fused" in parts),
                      teacher=object(), sparse_steps=s.warmup_steps, seed=params.seed)
    mu = state.mu
    state.annotations = list(notes)
    with peak_above_start() as warmup_peak:
        started = time.perf_counter()
        warm = state.warm_up()
        warmup_s = time.perf_counter() - started

    views = [trajectory_steps(a.trajectory) for a in notes]
    samples = [mu.target_sample(r) for a, steps in zip(notes, views, strict=True)
               for r in warmup_rows(a.question, steps, a.criteria, s.k, s.observation_chars)]
    started = time.perf_counter()
    rewards = mu.score(samples, micro_batch=s.micro_batch * 2)
    score_s = time.perf_counter() - started

    prompts = [step_messages(a.question.question, steps, t, s.k, s.observation_chars)
               for a, steps in zip(notes, views, strict=True) for t in range(len(steps))][:write_steps]
    with peak_above_start() as write_peak:
        started = time.perf_counter()
        written = mu.write(prompts, temperature=0.0, max_tokens=s.criteria_max_tokens)
        write_s = time.perf_counter() - started if prompts else None  # --write-steps 0: not measured

    adapter = mu.adapter_state(ADAPTER)  # detached copies
    out = {
        "mode": mode, "warmup_s": warmup_s, "score_s": score_s, "write_s": write_s,
        "warmup_peak_above_start_mib": warmup_peak["mib"],
        "write_peak_above_start_mib": write_peak["mib"] if prompts else None,
        "micro_batch_tokens": s.micro_batch_tokens, "checkpoint_min_tokens": s.checkpoint_min_tokens,
        "write_batch": s.write_batch,
        "warmup_optimizer_steps": warm.get("mu/warmup_optimizer_steps"), "warmup_loss_nll": warm.get("mu/warmup_nll"),
        "samples": len(samples), "sample_tokens": sum(len(x.prompt_ids) + len(x.criteria_ids) for x in samples),
        "written_tokens": sum(len(w.criteria_ids) for w in written),
    }
    state.close()  # mu's llama.cpp server, when it writes there
    del state, mu
    gc.collect()
    return {"row": out, "adapter": adapter, "rewards": rewards, "written": [list(w.criteria_ids) for w in written]}


def changes(other: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """What ``other`` computes differently from ``base``: adapter, step rewards, written replies."""
    adapter = max(float((other["adapter"][k] - v).abs().max()) for k, v in base["adapter"].items())
    pairs = [(a, b) for a, b in zip(other["rewards"], base["rewards"], strict=True) if a is not None and b is not None]
    reward = max((abs(a - b) for a, b in pairs), default=0.0)
    same = sum(a == b for a, b in zip(other["written"], base["written"], strict=True))
    return {"adapter_max_abs_diff": adapter, "step_reward_max_abs_diff": reward,
            "replies_identical": f"{same} of {len(base['written'])}"}


def main() -> None:
    """How it measures, and what it writes.

    ``--modes BASE OTHER ...``: ``fp32`` (peft's forward over the fp32 base), or ``+``-joined parts: ``fused``
    (``grpo.fused_lora``, on by default), ``int8`` (``grpo.int8_base``), ``padded`` (``arco.micro_batch_tokens`` null
    and ``arco.prefix_packing`` false: one pass over a micro-batch's steps, each padded to the longest), ``grouped``
    (``arco.prefix_packing`` false: passes over length-sorted groups of steps instead of shared-prefix packs), ``recompute`` (``arco.checkpoint_min_tokens``
    0: every micro-batch recomputes its activations), ``kept`` (every micro-batch keeps them) and ``KEY=VALUE`` (any
    ``arco`` key, e.g. ``write_batch=8``); what a mode does not name is as ``params.yaml`` has it. Each
    OTHER is measured against BASE. Each mode builds mu
    as the ``arco`` variant does (:func:`components.methods.arco.model_setup.load_backbone` on ``arco.model_role``, mu's
    LoRA and score head under ``seed``: :func:`components.methods.arco.variants.build_mu`) and runs, in this order:

    - **warm-up**: :meth:`ArcoState.warm_up` (its peak resident memory above the memory it started with, too) on ``--trajectories`` of the ``sft_data`` stage's teacher trajectories
      (training questions), ``--epochs`` passes at ``arco.micro_batch`` trajectories an optimizer step, each step of a
      trajectory one sample of mu's prompt and three criteria. The teacher's annotations are not on disk, so the
      criteria are written from the step itself (its query or answer, a reuse check, a no-repeat check), about the
      teacher's length; what is timed is mu's arithmetic, not the criteria's wording;
    - **score**: :meth:`RubricModel.score` (no gradient) of the same samples after the warm-up;
    - **write**: :meth:`RubricModel.write` of the first ``--write-steps`` steps' criteria, greedy, at most
      ``arco.criteria_max_tokens`` (transformers ``generate`` on the CPU, as ARCO's dense phase runs it).

    Modes alternate over ``--repeats`` (BASE, OTHER, ..., BASE, OTHER, ...; each a freshly built mu) and each time is
    the median, so the first build's allocations do not weigh on BASE alone. What each OTHER changes: the adapter after the warm-up (largest difference from BASE's), the step rewards scored
    (largest difference), and the written token ids (how many replies are the same). Prints a table and writes JSON.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", type=mode_name, default=["fp32", "fused", "int8+fused"], metavar="MODE",
                        help=f"the base mode, then the modes measured against it: fp32, or parts joined by + of "
                             f"{', '.join(PARTS)}")
    parser.add_argument("--trajectories", type=int, default=4, help="teacher trajectories mu warms up on")
    parser.add_argument("--epochs", type=int, default=1, help="warm-up passes over them (0: none, to time scoring and writing alone)")
    parser.add_argument("--write-steps", type=int, default=4, help="steps whose criteria mu writes")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the modes, alternating; times are medians")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    from components.io import write_json

    params = trainer_params()
    started = time.perf_counter()
    notes = annotations(params, args.trajectories)
    print(f"{len(notes)} trajectories, {sum(len(a.criteria) for a in notes)} steps; micro_batch "
          f"{params.arco.micro_batch}, {args.epochs} epoch(s)", flush=True)

    outputs: dict[str, dict[str, Any]] = {}
    times: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}
    phases = [k for k in PHASES if k != "write_s" or args.write_steps]
    for r in range(args.repeats):
        for mode in args.modes:
            got = one_mode(params, mode, notes, args.write_steps, args.epochs)
            outputs.setdefault(mode, got)
            times[mode].append({k: got["row"][k] for k in phases})
            print(f"repeat {r + 1} {mode}: " + ", ".join(f"{k} {got['row'][k]:.1f}" for k in phases), flush=True)
    for mode, passes in times.items():
        outputs[mode]["row"].update({k: statistics.median(t[k] for t in passes) for k in phases})

    base_mode = args.modes[0]
    rows = [outputs[m]["row"] for m in args.modes]
    ratios = {m: {k: outputs[m]["row"][k] / outputs[base_mode]["row"][k] for k in phases} for m in args.modes[1:]}
    numbers = {m: changes(outputs[m], outputs[base_mode]) for m in args.modes[1:]}

    w = max(len(f"{m} / {base_mode}") for m in args.modes) + 2
    print(f"\n{'mode':{w}}" + "".join(f"{k:>12}" for k in phases) + f"{'warm-up peak MiB':>18}")
    for row in rows:
        peak = row["warmup_peak_above_start_mib"]
        print(f"{row['mode']:{w}}" + "".join(f"{row[k]:>12.1f}" for k in phases) + f"{'-' if peak is None else f'+{peak:.0f}':>18}")
    for mode, ratio in ratios.items():
        print(f"{mode + ' / ' + base_mode:{w}}" + "".join(f"{ratio[k]:>11.2f}x" for k in phases))
    for mode, figures in numbers.items():
        print(f"{mode}: " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()))

    report = {
        **run_record(),
        "command": (f"python perf/bench_arco_mu.py --modes {' '.join(args.modes)} --trajectories {args.trajectories} "
                    f"--epochs {args.epochs} --write-steps {args.write_steps} --repeats {args.repeats}"),
        "size": {"trajectories": len(notes), "steps": sum(len(a.criteria) for a in notes),
                 "micro_batch": params.arco.micro_batch, "epochs": args.epochs, "write_steps": args.write_steps,
                 "repeats": args.repeats,
                 "lora_r": params.lora.r, "criteria_max_tokens": params.arco.criteria_max_tokens},
        "wall_s": time.perf_counter() - started,
        "results": rows,
        "ratios": ratios,
        "fidelity": numbers,
    }
    write_json(args.out, report, sort_keys=False)
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
