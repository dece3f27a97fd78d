"""Stage `train_policy@<variant>`: GRPO of the search agent from the warm start, with a method's variant
(grpo, dapo, and each method's own as it lands) plugged into the one trainer.

    python -m tasks.train_policy --variant grpo [--set grpo.steps=4]

Reads outputs/data/train.jsonl, the corpus and index, and the warm-start adapter of the variant's agent
(``train_policy.warm_start``: react -> the ``sft`` stage's, scaffold -> ``sft_scaffold``'s; merged into the base
so the KL reference is the warm-started policy).
Writes under outputs/train/<variant>/: adapter/ (the RL LoRA over the merged base), ckpt/ (resumable:
weights, optimizer, scheduler, RNG, data position, method state), metrics.csv (one row per step; a DVC
plot) and metrics.json (last step, plus ``dev_before.*`` / ``dev_after.*``: EM, F1, answered rate and
search-budget endings of greedy episodes on ``train_policy.eval_questions`` dev questions, served by the
same rollout engine before the first and after the last update, batch-invariant by default:
``train_policy.eval_batch_invariant``), dev_{before,after}.jsonl (those trajectories). Fresh runs that
start from the same weights and evaluate the same way (the variants of one warm start in a sweep) measure
``dev_before`` once and share it through ``run.cache_dir``/dev_before/ (batch-invariant evaluations only).

``--set train_policy.branch_from=outputs/train/arco/ckpt/step_000001`` starts a run from another run's
checkpoint (an ablation sharing that run's first steps); its ``dev_before`` is then the policy at the branch
point, and its metrics.csv starts with the source run's steps.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path

import pandas as pd
from prefect import task
from pydantic import BaseModel

from components.agents.react import build_agent
from components.evaluation.metrics import exact_match, f1_score
from components.io import read_json, read_jsonl, write_json
from components.llm.factory import LLMPool
from components.method_registry import variant_method
from components.training.variants import VARIANTS, VariantContext, get_variant
from components.params import Params, lora_paths
from components.schemas import Question
from components.training.agent_rollout import make_agent_rollout
from components.training.model import LoRASettings, build_policy
from components.training.rollout import HFRolloutEngine, SamplingParams
from components.training.trainer import GRPOTrainer
from tasks.runtime import (
    keyed_folder,
    load_toolbox,
    out_path,
    params_from_args,
    release_memory,
    resolve,
    settings_digest,
    stage_argparser,
    tracking,
    warm_start_folder,
    write_trajectories,
)
from tasks.sft import load_trainable_policy


class TrainResult(BaseModel):
    variant: str
    adapter: str
    metrics: dict[str, float]


def warm_start_method(params: Params, agent: str) -> str | None:
    """The warm-start method (``train_policy.warm_start``) of ``agent``; None: the base model."""
    return params.train_policy.warm_start.get(agent)


def warm_start_adapter(params: Params, agent: str) -> Path | None:
    """The adapter the sft stage trained for ``agent``'s warm-start method; None for the base model."""
    method = warm_start_method(params, agent)
    return None if method is None else warm_start_folder(params, "sft", method) / "adapter"


def warm_started_policy(params: Params, agent: str = "react"):
    """(Policy with a fresh RL LoRA over base + merged warm-start adapter of ``agent``, tokenizer)."""
    model, tokenizer = load_trainable_policy(params)
    adapter = warm_start_adapter(params, agent)
    if adapter is not None:
        if not (adapter / "adapter_config.json").exists():
            method = warm_start_method(params, agent)
            raise FileNotFoundError(f"train_policy.warm_start.{agent}={method}: {adapter} holds no adapter (run "
                                    f"the {adapter.parent.name} stage, or set train_policy.warm_start.{agent}=null "
                                    "to start from the base)")
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    lora = params.lora
    policy = build_policy(model, lora=LoRASettings(r=lora.r, alpha=lora.alpha, dropout=lora.dropout) if lora.r else None,
                          gradient_checkpointing=params.grpo.gradient_checkpointing)
    return policy, tokenizer


def resumed_rows(history: list[dict[str, float]], csv_path: Path) -> list[dict[str, float]]:
    """metrics.csv rows for the steps a resumed trainer already took: its checkpointed history, plus the
    wall-clock timings (``time/*``, kept out of the checkpoint) read back from the csv the run wrote."""
    earlier = ({int(r["step"]): r for r in pd.read_csv(csv_path).to_dict("records")}
               if history and csv_path.exists() else {})
    return [{"step": i + 1, **h, **{k: v for k, v in earlier.get(i + 1, {}).items() if k.startswith("time/")}}
            for i, h in enumerate(history)]


def accumulated_timings(path: Path, seconds: float) -> dict:
    """timings.json after an invocation of ``seconds``: a resumed run adds to what its earlier invocations
    spent (the folder is keyed, so an earlier file there is this run's)."""
    earlier = read_json(path) if path.exists() else {}
    sessions = [*earlier.get("sessions_s", [earlier["wall_s"]] if "wall_s" in earlier else []), seconds]
    return {"wall_s": sum(sessions), "sessions_s": sessions}


def run_settings(params: Params, variant: str, agent: str = "react") -> dict:
    """What a run of ``variant`` (rolling out ``agent``) is: a checkpoint is resumed only under the same settings
    and the same warm-start weights; ``grpo.steps`` (so a finished run can be extended), micro-batching (the
    same update, to a float tolerance; less memory) and how the dev evaluation is served may change."""
    from components.embedded.lora_gguf import adapter_digest

    warm = warm_start_adapter(params, agent)
    sections = ("seed", "data", "world", "retrieval", "agent", "llm", "lora")
    settings = {name: getattr(params, name) for name in sections}
    settings["train_policy"] = params.train_policy.model_dump(exclude={"warm_start", "eval_batch_invariant",
                                                                       "branch_from"})
    settings["branch_from"] = branch_digest(params.train_policy.branch_from)
    method = warm_start_method(params, agent)
    settings["warm_start_method"] = params.methods.get(method) if method else None  # its prompts carry over
    owner = variant_method(variant)  # the registering method's own section; None for grpo and dapo
    section = owner.sections[0] if owner is not None else None
    execution = {"steps", "micro_batch_size", "micro_batch_tokens", "gradient_checkpointing"}  # the same update
    own = getattr(params, section) if section is not None else None
    if own is not None:  # fields marked execution-only (how work is batched) may change on resume too
        own = own.model_dump(exclude={name for name, f in type(own).model_fields.items()
                                      if (f.json_schema_extra or {}).get("execution")})
    settings.update(variant=variant, grpo=params.grpo.model_dump(exclude=execution), method=own,
                    warm_start=adapter_digest(warm) if warm is not None else None)
    return {k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in settings.items()}


def branch_digest(branch_from: str | None) -> str | None:
    """The run-key entry of ``train_policy.branch_from``: the sha256 of the checkpoint's manifest (which lists
    every file's sha256), so a branch is keyed by the weights and state it starts from, not by a path."""
    if branch_from is None:
        return None
    import hashlib

    manifest = Path(branch_from) / "manifest.json"
    if not manifest.exists():
        raise FileNotFoundError(f"train_policy.branch_from={branch_from}: no {manifest.name} there; name a complete "
                                "checkpoint folder such as outputs/train/arco/ckpt/step_000001")
    return hashlib.sha256(manifest.read_bytes()).hexdigest()


LINEAGE_VERSION = 2  # 1: adapters by path, so a run in another run.out_dir could not branch from the same weights


def lineage_settings(settings: dict, version: int = LINEAGE_VERSION) -> dict:
    """What a run shares with the runs that may branch from it: its settings without the variant and the branch
    point. The backends' adapters count by content (:func:`adapter_digest`; None when absent), not by path:
    paths follow ``run.out_dir``, which differs between a sweep's runs and a stage run beside them. ``version``
    1 kept the paths (the lineage.json of older runs)."""
    from components.embedded.lora_gguf import adapter_digest

    shared = {k: v for k, v in settings.items() if k not in ("variant", "branch_from")}
    if version >= 2:
        shared["llm"] = {**shared["llm"], "backends": {
            name: {**b, "lora": [adapter_digest(p) for p in lora_paths(b["lora"])]} if b.get("lora") else b
            for name, b in shared["llm"]["backends"].items()}}
    return shared


def lineage(settings: dict, version: int = LINEAGE_VERSION) -> str:
    """The digest of :func:`lineage_settings` (written to lineage.json, checked by :func:`check_branch`)."""
    return settings_digest(lineage_settings(settings, version))


def lineage_record(settings: dict) -> dict:
    """lineage.json's content: the digest, its version and the settings digested (a refusal names what differs)."""
    shared = lineage_settings(settings)
    return {"lineage": settings_digest(shared), "version": LINEAGE_VERSION,
            "settings": json.loads(json.dumps(shared, default=str))}


def _differences(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    return [] if a == b else [path]


def shared_dev_before(params: Params, settings: dict, agent: str, options: dict, dev: list[Question]) -> Path:
    """Where the dev evaluation of a fresh run's starting weights is kept for every run that starts from the
    same weights and evaluates the same way (``run.cache_dir``/dev_before/<key>/): the variants of one warm
    start measure their ``dev_before`` once. The key is the run's settings without what only training reads
    (variant, the method's section, GRPO, training questions), plus the agent, its options (an object by its
    type, e.g. an empty rubric bank's guidance) and the dev questions. Only batch-invariant evaluations are
    shared: a batched one is not a function of its key."""
    plain = (str, int, float, bool, type(None), list, dict)
    kept = {k: v for k, v in settings.items() if k not in ("variant", "method", "grpo", "branch_from", "train_policy")}
    kept["train_policy"] = {k: v for k, v in settings["train_policy"].items() if k != "n_questions"}
    kept.update(agent=agent, options={k: v if isinstance(v, plain) else type(v).__name__ for k, v in options.items()},
                dev=[q.model_dump() for q in dev])
    return Path(params.run.cache_dir) / "dev_before" / settings_digest(kept)


def measure_dev_before(rollout_fn, engine, dev: list[Question], max_new_tokens: int, folder: Path,
                       batch_invariant: bool, shared: Path | None) -> None:
    """dev_before.json/.jsonl in ``folder``: copied from ``shared`` when another run measured the same start,
    else measured (and left in ``shared`` for the next run)."""
    import shutil

    names = ("dev_before.json", "dev_before.jsonl")
    if shared is not None and all((shared / n).exists() for n in names):
        for n in names:
            shutil.copyfile(shared / n, folder / n)
        return
    result = dev_evaluation(rollout_fn, engine, dev, max_new_tokens, folder / names[1], batch_invariant)
    write_json(folder / names[0], result)
    if shared is not None:
        shared.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / names[1], shared / names[1])
        shutil.copyfile(folder / names[0], shared / names[0])  # last: its presence says the pair is whole


def check_branch(branch: str, settings: dict) -> None:
    """Refuse a branch point from a run trained under other shared settings (warm start, data, LoRA, GRPO,
    the method's section): its LoRA would sit on another base. A source run older than lineage.json is
    accepted with a warning."""
    source = Path(branch).parent.parent / "lineage.json"
    if not source.exists():
        import warnings

        warnings.warn(f"train_policy.branch_from={branch}: the source run has no lineage.json; cannot check that it "
                      "was trained under this run's warm start and settings", stacklevel=2)
        return
    stored = read_json(source)
    shared = lineage_settings(settings, stored.get("version", 1))
    if stored["lineage"] != settings_digest(shared):
        here = json.loads(json.dumps(shared, default=str))
        differ = _differences(stored["settings"], here) if "settings" in stored else []
        what = ", ".join(differ[:6]) if differ else "warm start, data, agent, llm, lora, grpo or the method's section"
        raise ValueError(f"train_policy.branch_from={branch}: that run was trained under other settings than this "
                         f"one ({what} differ; {source})")


def warm_start_options(params: Params, agent: str) -> dict:
    """The agent options ``agent``'s warm start was trained under (e.g. ``methods.sft``'s compact system prompt);
    a variant's own options override them."""
    method = warm_start_method(params, agent)
    warm = params.methods.get(method) if method else None
    if warm is None or warm.agent != agent:
        return {}
    return dict(warm.options)


def make_engine(params: Params, policy, tokenizer, base_adapters=()):
    """The rollout engine ``train_policy.engine`` names for ``policy``; ``base_adapters`` are the adapters
    merged into the policy's base (the llama.cpp engine serves them under the trained one)."""
    if params.train_policy.engine == "hf":
        return HFRolloutEngine(policy.model, tokenizer)
    from components.training.llamacpp_engine import engine_for_policy

    return engine_for_policy(params, policy, tokenizer, base_adapters)


def dev_evaluation(rollout_fn, engine, questions: list[Question], max_new_tokens: int, path: Path,
                   batch_invariant: bool = False) -> dict[str, float]:
    """Greedy episodes of the policy the engine serves now, on ``questions``: mean EM and F1 (unanswered
    scores 0), answered rate and share of search-budget endings; the trajectories go to ``path``.
    ``batch_invariant``: inside the engine's ``batch_invariant()`` (reported as ``batch_invariant`` 1/0, so a
    before/after pair measured two ways shows it)."""
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    with engine.batch_invariant() if batch_invariant else nullcontext():
        episodes = rollout_fn(engine, questions, 1, sampling)
    trajectories = [e.info["trajectory"] for e in episodes]
    write_trajectories(path, trajectories)
    n = len(trajectories)
    golds = {q.id: q.answers for q in questions}
    return {
        "em": sum(exact_match(t.final_answer, golds[t.question_id]) for t in trajectories) / n,
        "f1": sum(f1_score(t.final_answer, golds[t.question_id]) for t in trajectories) / n,
        "answered": sum(t.finish_reason == "answer" for t in trajectories) / n,
        "search_budget": sum(t.finish_reason == "search_budget" for t in trajectories) / n,
        "batch_invariant": float(batch_invariant),
    }


@task(name="train_policy")
def train_policy(params: Params | None = None, variant: str = "grpo", parent_run_id: str | None = None,
                 pool: LLMPool | None = None) -> TrainResult:
    params = resolve(params)
    import torch

    torch.manual_seed(params.seed)
    builder = get_variant(variant)
    questions = read_jsonl(out_path(params, "data", "train.jsonl"), Question)[: params.train_policy.n_questions]
    toolbox = load_toolbox(params)
    folder = out_path(params, "train", variant, "metrics.json").parent
    own_pool = pool is None
    pool = pool or LLMPool(params)
    started = time.perf_counter()
    engine = policy = trainer = None
    try:
        # builders only construct (nothing is written before the folder is keyed); the key needs their agent
        parts = builder(VariantContext(params=params, roles=pool.role, toolbox=toolbox, out_dir=folder))
        settings = run_settings(params, variant, parts.agent)
        keyed_folder(folder, settings)
        write_json(folder / "lineage.json", lineage_record(settings))
        if params.train_policy.branch_from is not None:
            check_branch(params.train_policy.branch_from, settings)
        policy, tokenizer = warm_started_policy(params, parts.agent)
        warm = warm_start_adapter(params, parts.agent)
        engine = make_engine(params, policy, tokenizer, [warm] if warm is not None else [])
        options = {**warm_start_options(params, parts.agent), **parts.agent_options}
        rollout_fn = make_agent_rollout(
            lambda p: build_agent(parts.agent, lambda role: p, toolbox, params.agent, options), tokenizer)
        rows: list[dict[str, float]] = []
        with tracking(params, f"train_policy@{variant}", parent_run_id,
                      tags={"method": variant, "variant": variant}) as tracker:
            tracker.log_params({"variant": variant, "grpo": params.grpo.model_dump(), "lora": params.lora.model_dump(),
                                "train_policy": params.train_policy.model_dump()})

            def log(step: int, metrics: dict[str, float]) -> None:
                if rows and rows[-1]["step"] == step:  # the method's end-of-training metrics join the last step
                    rows[-1].update(metrics)
                else:
                    rows.append({"step": step, **metrics})
                tracker.log_metrics(metrics, step=step)
                pd.DataFrame(rows).to_csv(folder / "metrics.csv", index=False)  # kept current: a crash loses nothing

            config = params.grpo
            if parts.order_prompts is not None:  # the variant's curriculum fixes the order
                questions, config = parts.order_prompts(questions), config.model_copy(update={"shuffle": False})
            trainer = GRPOTrainer(policy, engine, parts.reward_fn, questions, config,
                                  rollout_fn=rollout_fn, advantage_fn=parts.advantage_fn, loss_fn=parts.loss_fn,
                                  extra_modules=parts.extra_modules, method=parts.method, on_metrics=log,
                                  checkpoint_dir=folder / "ckpt", seed=params.seed,
                                  pad_token_id=tokenizer.pad_token_id or 0)
            branch = params.train_policy.branch_from
            started_from = trainer.resume_or_branch(branch)
            # a branch's first steps are the source run's (.../<run>/ckpt/step_N): their timings are in its csv
            csv_path = Path(branch).parent.parent / "metrics.csv" if started_from == "branch" else folder / "metrics.csv"
            rows[:] = resumed_rows(trainer.history, csv_path)
            dev = read_jsonl(out_path(params, "data", "dev.jsonl"), Question)[: params.train_policy.eval_questions]
            before_file = folder / "dev_before.json"
            invariant = params.train_policy.eval_batch_invariant
            if dev and not before_file.exists():  # the folder is keyed: a measurement in it is of this run
                fresh = started_from == "fresh" and invariant
                shared = shared_dev_before(params, settings, parts.agent, options, dev) if fresh else None
                measure_dev_before(rollout_fn, engine, dev, config.max_new_tokens, folder, invariant, shared)
            history = trainer.train(params.grpo.steps)
            trainer.save()
            policy.model.save_pretrained(str(folder / "adapter"))
            last = {k: round(float(v), 6) for k, v in history[-1].items()} if history else {}
            if dev:
                after = dev_evaluation(rollout_fn, engine, dev, config.max_new_tokens, folder / "dev_after.jsonl",
                                       invariant)
                before = read_json(before_file)
                last.update({f"dev_before.{k}": round(v, 6) for k, v in before.items()})
                last.update({f"dev_after.{k}": round(v, 6) for k, v in after.items()})
                tracker.log_metrics({k: v for k, v in last.items() if k.startswith("dev_")})
            write_json(folder / "metrics.json", last)
            write_json(folder / "timings.json", accumulated_timings(folder / "timings.json", time.perf_counter() - started))
            tracker.log_metrics(pool.accounting.metrics())
            tracker.log_artifact(folder / "metrics.csv")
            for snapshots in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in ("ckpt", "adapter")):
                tracker.log_artifact(snapshots, artifact_path=f"method_state/{snapshots.name}")  # memories, banks
    finally:
        if engine is not None and hasattr(engine, "close"):
            engine.close()
        if own_pool:
            pool.close()
        engine = policy = trainer = None  # dropped before the memory goes back
        release_memory()
    return TrainResult(variant=variant, adapter=str(folder / "adapter"), metrics=last)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--variant", default="grpo", help=f"one of {VARIANTS.names()}")
    args = parser.parse_args()
    print(train_policy.fn(params_from_args(args), variant=args.variant).model_dump_json(indent=2))


if __name__ == "__main__":
    main()
