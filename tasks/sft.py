"""Stage `sft`: the warm start. LoRA SFT of the trainable policy on the `sft_data` trajectories, rendered
under the agent's own evaluation prompts (observations masked), so every method starts from a policy that
can search.

    python -m tasks.sft [--set sft.epochs=2]
    python -m tasks.sft --method sft_scaffold     # RubricEM's scaffold warm start -> outputs/sft_scaffold/
    torchrun --nproc_per_node 2 -m tasks.sft      # data-parallel, rank 0 writes: docs/data_parallel.md

``--method`` names the warm start (a params.methods entry, default ``sft``): rows are rendered under its
agent and options, the prompts ``evaluate --method`` uses for the adapter.
Reads outputs/sft_data/trajectories.jsonl (outputs/sft_data_<name>/ for ``sft_<name>``; the questions they
answer are stored in the trajectories' metadata) and, where sft_data wrote any, reflections.jsonl: one row
each, the reflection prompt (not trained) and the reflection (trained). Writes outputs/sft/
(outputs/sft_<name>/): adapter/ (peft adapter), loss.csv (DVC plot: loss per optimizer step), metrics.json and
ckpt/ (resumable checkpoints).
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import pandas as pd
from prefect import task
from pydantic import BaseModel

from components.adapters import save_adapter
from components.embedded.models import sha256_file
from components.io import read_jsonl, write_json
from components.method_registry import agent_method, method_section
from components.methods.rubricem.warmstart_reflections import (
    REFLECTIONS_FILE,
    ReflectionRow,
    reflection_sft_row,
)
from components.params import Params, with_method_settings
from components.params_cli import params_from_args, stage_argparser
from components.run_files import SFT_METHOD, keyed_folder
from components.run_spec import run_spec
from components.schemas import Trajectory
from components.training.distributed import current_ranks
from components.training.grpo.agent_rollout import chat_template_renderer
from components.training.model import LoRASettings, build_policy, load_trainable_policy
from components.training.sft.examples import build_sft_example
from components.training.sft.trainer import SFTTrainer
from components.training.sft.trajectories import warm_start_examples
from tasks.runtime import NullTracker, resolve, tracking


class SFTResult(BaseModel):
    adapter: str
    metrics: dict[str, float]


def reflection_examples(params: Params, method: str, tokenizer, render) -> tuple[list, int]:
    """The sft_data stage's reflection rows as examples, and how many were left out for being longer than
    ``sft.max_length`` (cut at the right, the reflection would lose its closing block)."""
    path = run_spec(params).warm_start_folder("sft_data", method) / REFLECTIONS_FILE
    chars = params.rubricem.reflection_observation_chars
    examples = [build_sft_example(reflection_sft_row(r, render, chars), tokenizer)
                for r in (read_jsonl(path, ReflectionRow) if path.exists() else [])]
    fits = [e for e in examples if len(e.input_ids) <= params.sft.max_length]
    return fits, len(examples) - len(fits)


@task(name="sft")
def sft(params: Params | None = None, parent_run_id: str | None = None, method: str = SFT_METHOD) -> SFTResult:
    params = resolve(params)
    # the warm start of a method's own agent (RubricEM's scaffold) takes that method's sft/agent blocks
    params = with_method_settings(params, method_section(agent_method(params.methods[method].agent)))
    spec = run_spec(params)
    import torch

    from components.training.checkpoint import seed_rngs

    seed_rngs(params.seed)  # python, numpy and torch: what a checkpoint saves and a resumed run restores
    if params.run.torch_threads:
        torch.set_num_threads(params.run.torch_threads)
    ranks = current_ranks()  # under torchrun: rank 0 alone keys the folder, writes and logs; rank 0 of 1 without
    folder = run_spec(params).warm_start_folder("sft", method)
    data = run_spec(params).warm_start_folder("sft_data", method)
    trajectories = read_jsonl(data / "trajectories.jsonl", Trajectory)
    # a checkpoint is resumed only by a run of the same settings and data (a max_steps=3 run once resumed a
    # max_steps=1 run's checkpoint); how rows are batched and recomputed may change
    execution = {"micro_batch_size", "gradient_checkpointing", "checkpoint_min_tokens", "checkpoint_every",
                 "fused_lora", "prefix_packing"}
    keyed_folder(folder, {
        "method": method, "seed": params.seed, "sft": params.sft.model_dump(exclude=execution),
        "lora": params.lora.model_dump(), "agent": params.agent.model_dump(),
        "spec": params.methods[method].model_dump(), "rubricem": params.rubricem.reflection_observation_chars,
        "policy": spec.backend("trainable_policy").model_dump(),
        "zero": params.train_policy.deepspeed.keyed(),
        "data": {name: sha256_file(data / name) for name in ("trajectories.jsonl", REFLECTIONS_FILE)
                 if (data / name).exists()},
    }, adopt_unkeyed=True, ranks=ranks)
    model, tokenizer = load_trainable_policy(spec)
    render = chat_template_renderer(tokenizer)
    examples = warm_start_examples(params.methods[method], params.agent, params.sft.max_length, trajectories, tokenizer)
    reflections, reflections_too_long = reflection_examples(params, method, tokenizer, render)
    examples += reflections
    lora = params.lora
    policy = build_policy(model, lora=LoRASettings(r=lora.r, alpha=lora.alpha, dropout=lora.dropout) if lora.r else None,
                          gradient_checkpointing=params.sft.gradient_checkpointing, int8_base=params.sft.int8_base,
                          fused_lora=params.sft.fused_lora)
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tracking(params, folder.name, parent_run_id) if ranks.main else nullcontext(NullTracker()) as tracker:
        tracker.log_params({"method": method, "sft": params.sft.model_dump(), "lora": lora.model_dump(), "agent": params.agent.model_dump(),
                           "deepspeed": params.train_policy.deepspeed.model_dump()})
        trainer = SFTTrainer(policy, examples, params.sft, pad_token_id=tokenizer.pad_token_id or 0,
                             seed=params.seed, checkpoint_dir=folder / "ckpt", zero=params.train_policy.deepspeed,
                             on_metrics=lambda step, m: tracker.log_metrics(m, step=step), ranks=ranks)
        trainer.resume()
        history = trainer.train(progress=f"sft ({method})")
        trainer.save()  # every rank: its own optimizer and RNG files
        curve = pd.DataFrame(history)[["step", "loss", "tokens", "lr"]]
        first, last = curve["loss"].iloc[: max(1, len(curve) // 10)].mean(), curve["loss"].iloc[-max(1, len(curve) // 10):].mean()
        metrics = {"trajectories": float(len(trajectories)), "rows": float(len(examples)),
                   "reflection_rows": float(len(reflections)), "reflection_rows_too_long": float(reflections_too_long),
                   "trained_tokens": float(sum(sum(e.loss_mask) for e in examples)),
                   "optimizer_steps": float(len(history)), "loss_first_tenth": round(float(first), 6),
                   "loss_last_tenth": round(float(last), 6)}
        with trainer.stepper.full_weights():  # ZeRO-3: every rank gathers the weights rank 0 writes
            if ranks.main:
                save_adapter(policy.model, folder / "adapter")
        if ranks.main:
            curve.to_csv(folder / "loss.csv", index=False)
            write_json(folder / "metrics.json", metrics)
            write_json(folder / "timings.json", {"wall_s": time.perf_counter() - started})
            tracker.log_metrics(metrics)
            tracker.log_artifact(folder / "loss.csv")
        ranks.barrier()  # the other ranks end once rank 0's files are written
    return SFTResult(adapter=str(folder / "adapter"), metrics=metrics)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--method", default=SFT_METHOD, help="the warm start (params.methods entry): sft or sft_<name>")
    args = parser.parse_args()
    print(sft.fn(params_from_args(args), method=args.method).model_dump_json(indent=2))


if __name__ == "__main__":
    from tasks.runtime import run_stage

    run_stage(main)
