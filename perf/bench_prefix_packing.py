"""The GRPO trainer's update over groups that share a prompt: length-sorted padded micro-batches against
shared-prefix packs (``grpo.prefix_packing``), side by side in one process, and what packing changes in the numbers.

Run (about 10 minutes on 2 cores at the defaults; the ``collect`` stage's branching points, the listwise
``train_rubric_generator`` run's held-out rubrics and the ``sft`` adapter present)::

    python perf/bench_prefix_packing.py [--prompts 2] [--repeats 2] [--out perf/results/prefix_packing.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from perf.bench_int8_base import run_record, trainer_params

RESULTS = Path(__file__).parent / "results" / "prefix_packing.json"
MODES = ("padded", "packed")


def generator_rows(params: Any, tokenizer: Any, prompts: int) -> tuple[Any, Any]:
    """The rubric generator's rows for ``prompts`` branching points, ``group_size`` rubrics each, as one
    :class:`RolloutBatch`, and the +1 / -1 advantages per token."""
    import torch

    from components.io import read_json, read_parquet
    from components.methods.coreact.rubric_training import prompt_items, usable_points
    from components.run_files import out_path
    from components.schemas import BranchingPoint
    from components.training.engines.rollout import RolloutSegment, assemble
    from components.training.grpo.agent_rollout import chat_template_renderer

    s = params.rubric_generator
    points, _ = usable_points(read_parquet(out_path(params.run, "collect", "branching_points.parquet"), BranchingPoint))
    items = prompt_items(points[:prompts], chat_template_renderer(tokenizer), s.max_criteria,
                         params.coreact.observation_chars, max_chars=s.max_criterion_chars)
    heldout = read_json(out_path(params.run, "train_rubric_generator", "listwise", "heldout.json"))
    rubrics = [r["rubric"] for r in heldout["rubrics_before"] + heldout["rubrics_after"] if r["rubric"]]
    if len(items) < prompts or len(rubrics) < s.group_size:
        raise SystemExit(f"need {prompts} usable branching points and {s.group_size} rubrics: run collect and "
                         "train_rubric_generator@listwise first")
    rows, signs = [], []
    for item in items:
        prompt = tokenizer.encode(item["prompt"], add_special_tokens=False)
        for g in range(s.group_size):
            reply = tokenizer.encode(rubrics[(len(rows) + g) % len(rubrics)], add_special_tokens=False)[: s.max_tokens]
            rows.append([RolloutSegment(prompt, False), RolloutSegment(reply + [tokenizer.eos_token_id], True)])
            signs.append(1.0 if g % 2 == 0 else -1.0)
    batch = assemble(rows, pad_token_id=tokenizer.pad_token_id or 0)
    return batch, torch.tensor(signs)[:, None] * batch.loss_mask.float()


def one_update(policy: Any, tokenizer: Any, config: Any, start: dict[str, Any], batch: Any,
               advantages: Any) -> dict[str, Any]:
    """One :meth:`GRPOTrainer.update` from the LoRA weights ``start``: its time, metrics, pass tokens, weights after."""
    import torch

    from components.training.engines.rollout import HFRolloutEngine
    from components.training.grpo.trainer import GRPOTrainer

    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if n in start:
                p.copy_(start[n])
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, tokenizer), lambda episodes, ctx: [], [{}], config)
    micros = trainer._micro_batches(torch.arange(len(batch)), batch)
    subs = [batch.select(m) for m in micros]
    tokens = sum(trainer._pass_tokens(sub, trainer._pack(sub)) for sub in subs)
    started = time.perf_counter()
    metrics = trainer.update(batch, advantages)
    seconds = time.perf_counter() - started
    trained = [(n, p) for n, p in policy.model.named_parameters() if p.requires_grad]
    after = {n: p.detach().clone() for n, p in trained}
    grad = torch.cat([p.grad.flatten() for _, p in trained])  # the update's one optimizer step leaves it in place
    return {"update_s": seconds, "loss": metrics["loss"], "kl": metrics["kl"], "pass_tokens": tokens,
            "micro_batches": len(micros), "after": after, "grad": grad}


def main() -> None:
    """How it measures, and what it writes.

    The rows are Co-ReAct's rubric generator's, as ``train_rubric_generator`` trains it: for each of ``--prompts``
    branching points (the first of ``outputs/collect/branching_points.parquet``), the generator's prompt rendered as
    that stage renders it, and ``rubric_generator.group_size`` completions, taken from the rubrics the listwise run
    wrote for its held-out points (``heldout.json``; what is timed is the arithmetic, so any rubric of the right
    length serves). The update is :meth:`GRPOTrainer.update` under ``rubric_generator``'s GRPO settings
    (``generator_config``: ``micro_batch_tokens`` 2048, the KL term at its ``kl_coef``, every micro-batch
    recomputing its activations), advantages of +1 / -1 within each group. The policy is the warm-started 0.5B as
    ``train_policy`` builds it (``warm_started_policy``) with its LoRA ``B`` drawn from N(0, 0.01), so that it differs
    from its reference; the generator's own backbone is the same architecture.

    Modes alternate over ``--repeats`` (padded, packed, padded, packed, ...), each from the same LoRA weights with a
    fresh optimizer; times are medians. What packing changes: the loss and KL the update reports, the LoRA gradient
    (cosine, and largest difference against the largest entry) and the LoRA weights after the optimizer step (largest
    difference; AdamW's first step moves every weight by about the learning rate whatever its gradient's size, so a
    weight whose gradient is next to nothing can move either way). Prints a table and writes JSON.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=2, help="branching points, each one group of rows")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--adapter-std", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1234, help="the fresh LoRA's A (peft's draw)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch

    from components.methods.coreact.rubric_training import generator_config
    from components.run_spec import run_spec
    from components.training.warm_started import warm_started_policy

    params = trainer_params()
    torch.manual_seed(args.seed)
    policy, tokenizer = warm_started_policy(run_spec(params))
    with torch.no_grad():
        for n, p in policy.model.named_parameters():
            if p.requires_grad and "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * args.adapter_std)
    start = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    batch, advantages = generator_rows(params, tokenizer, args.prompts)
    base = generator_config(params.grpo, params.rubric_generator, args.prompts)
    configs = {m: base.model_copy(update={"prefix_packing": m == "packed"}) for m in MODES}
    real = int(batch.attention_mask.sum())
    print(f"{len(batch)} rows ({args.prompts} prompts x {base.group_size}), {real} tokens; "
          f"micro_batch_tokens {base.micro_batch_tokens}, kl_coef {base.kl_coef}", flush=True)

    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for mode in MODES:
            run = one_update(policy, tokenizer, configs[mode], start, batch, advantages)
            runs[mode].append(run)
            print(f"repeat {repeat + 1} {mode}: update {run['update_s']:.1f} s, {run['pass_tokens']} pass tokens in "
                  f"{run['micro_batches']} micro-batches, loss {run['loss']:.6f}", flush=True)

    rows = []
    for mode in MODES:
        r = runs[mode]
        rows.append({"mode": mode, "update_s": statistics.median(x["update_s"] for x in r),
                     "update_s_all": [x["update_s"] for x in r], "pass_tokens": r[0]["pass_tokens"],
                     "micro_batches": r[0]["micro_batches"], "loss": r[0]["loss"], "kl": r[0]["kl"]})
    padded, packed = runs["padded"][0], runs["packed"][0]
    g, h = packed["grad"].double(), padded["grad"].double()
    change = {
        "loss_abs_diff": abs(packed["loss"] - padded["loss"]), "kl_abs_diff": abs(packed["kl"] - padded["kl"]),
        "grad_cosine": torch.nn.functional.cosine_similarity(g, h, dim=0).item(),
        "grad_max_abs_diff_over_max": ((g - h).abs().max() / h.abs().max()).item(),
        "lora_max_abs_diff": max((packed["after"][n] - padded["after"][n]).abs().max().item() for n in start),
        "lora_max_abs_step": max((padded["after"][n] - start[n]).abs().max().item() for n in start),
    }
    ratio = rows[1]["update_s"] / rows[0]["update_s"]
    print(f"\n{'mode':10} {'update_s':>9} {'pass tokens':>12} {'micro-batches':>14}")
    for row in rows:
        print(f"{row['mode']:10} {row['update_s']:9.1f} {row['pass_tokens']:12d} {row['micro_batches']:14d}")
    print(f"packed / padded: {ratio:.2f}x; {change}")
    out = {"command": " ".join(sys.argv), "rows": len(batch), "prompts": args.prompts, "group_size": base.group_size,
           "real_tokens": real, "micro_batch_tokens": base.micro_batch_tokens, "kl_coef": base.kl_coef,
           "modes": rows, "ratio_packed_over_padded": ratio, "changes": change,
           "wall_s": time.perf_counter() - started, **run_record()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
