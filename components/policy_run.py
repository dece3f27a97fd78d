"""One run of ``train_policy@<variant>``: GRPO of the search agent from its warm start, with the variant's parts
(reward, advantages, loss, method state, curriculum: :mod:`components.variants`) plugged into the one
trainer, and greedy dev evaluations before the first and after the last update.

    torch.manual_seed(params.seed)                         # before the inputs are read, as the stage does
    with PolicyRun(params, "arbor", pool.role, toolbox, folder) as run:   # keys the folder, loads the policy
        metrics = run.train(questions, dev, on_metrics=lambda step, m: print(step, m))

Opening a run builds the variant's parts, keys ``folder`` to the run's settings
(:mod:`components.training.grpo.policy_run_key`; other settings empty it, the same ones resume), writes
lineage.json, checks a ``train_policy.branch_from`` branch point, and loads the warm-started policy
(:mod:`components.training.warm_started`) with the rollout engine ``train_policy.engine`` names. :meth:`PolicyRun.train`
writes in ``folder``: ckpt/ (resumable), metrics.csv (one row per step, kept current), adapter/, and with dev
questions dev_before.{json,jsonl} (shared between fresh batch-invariant runs of the same start through
``run.cache_dir``/dev_before/) and dev_after.jsonl. With dev questions it also checks the run for reward hacking
(:func:`components.evaluation.gaming.gaming_check`: the judge's reward up while dev EM or F1 went down), logs
``gaming.*`` with the last step and warns when it is suspected. Closing the run closes the engine and hands the
memory back. On N data-parallel ranks (``torchrun``/``accelerate launch``: :mod:`components.training.distributed`)
every rank loads the policy and its own engine, rolls out its share of each step's prompts and of the dev questions,
and rank 0 alone keys the folder and writes its files (metrics.csv, rubrics/, dev_*, adapter/; checkpoints
take every rank's optimizer and RNG files).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Self

import pandas as pd

from components.adapters import save_adapter
from components.agents.react import build_agent
from components.evaluation.gaming import gaming_check
from components.evaluation.metrics import exact_match, f1_score
from components.io import read_json, write_json, write_jsonl
from components.params import Params
from components.run_files import keyed_folder, settings_digest, write_trajectories
from components.run_spec import RunSpec, run_spec
from components.schemas import Question
from components.training.distributed import Ranks, current_ranks
from components.training.engines.registry import ENGINES
from components.training.engines.rollout import SamplingParams
from components.training.grpo.agent_rollout import make_agent_rollout
from components.training.grpo.policy_run_key import check_branch, lineage_record, run_settings
from components.training.grpo.trainer import GRPOTrainer
from components.training.speed.process_memory import release
from components.training.warm_started import warm_start_adapter, warm_start_options, warm_started_policy
from components.variants import VariantContext, get_variant, variant_grpo

logger = logging.getLogger(__name__)


def make_engine(spec: RunSpec, policy, tokenizer, base_adapters=()):
    """The rollout engine ``train_policy.engine`` names for ``policy``
    (:data:`components.training.engines.registry.ENGINES`); ``base_adapters`` are the adapters merged into the
    policy's base (the llama.cpp engine serves them under the trained one, vLLM loads the base exported with
    them merged)."""
    return ENGINES.get(spec.engine).policy(spec, policy, tokenizer, list(base_adapters))


def write_rubrics(method: Any, folder: Path, step: int) -> None:
    """The rubrics a method holds after ``step``, in the shared rubric type, to ``folder/step_NNNNN.jsonl``
    (methods whose state has ``rubrics()``: ARBOR's memory, RubricEM's buffers and bank, ARCO's last criteria),
    so every method's rubrics can be read and compared the same way."""
    rubrics = getattr(method, "rubrics", None)
    if rubrics is None:
        return
    write_jsonl(folder / f"step_{step:05d}.jsonl", rubrics())


def dev_evaluation(rollout_fn, engine, questions: list[Question], max_new_tokens: int, path: Path,
                   batch_invariant: bool = False, ranks: Ranks | None = None) -> dict[str, float]:
    """Greedy episodes of the policy the engine serves now, on ``questions``: mean EM and F1 (unanswered
    scores 0), answered rate and share of search-budget endings; the trajectories go to ``path``.
    ``batch_invariant``: inside the engine's ``batch_invariant()`` (reported as ``batch_invariant`` 1/0, so a
    before/after pair measured two ways shows it). ``ranks``: each rank plays its contiguous share of the
    questions, and rank 0 writes them all in order."""
    ranks = ranks or Ranks()
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)
    mine = ranks.share(questions)
    with engine.batch_invariant() if batch_invariant else nullcontext():
        episodes = rollout_fn(engine, mine, 1, sampling) if mine else []
    trajectories = [t for part in ranks.gather([e.info["trajectory"] for e in episodes]) for t in part]
    if ranks.main:
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


def shared_dev_before(params: Params, settings: dict, agent: str, options: dict, dev: list[Question]) -> Path:
    """Where the dev evaluation of a fresh run's starting weights is kept for every run that starts from the
    same weights and evaluates the same way (``run.cache_dir``/dev_before/<key>/): the variants of one warm
    start measure their ``dev_before`` once. The key is the run's settings without what only training reads
    (variant, the method's section, GRPO, training questions), plus the agent, its options (an object by its
    type, e.g. an empty rubric bank's guidance) and the dev questions. Only batch-invariant evaluations are
    shared: a batched one is not a function of its key."""
    plain = (str, int, float, bool, type(None), list, dict)
    kept = {k: v for k, v in settings.items() if k not in ("variant", "method", "grpo", "branch_from", "train_policy")}
    kept["train_policy"] = {k: v for k, v in settings["train_policy"].items() if k not in ("n_questions", "first_question")}
    kept.update(agent=agent, options={k: v if isinstance(v, plain) else type(v).__name__ for k, v in options.items()},
                dev=[q.model_dump() for q in dev])
    return Path(params.run.cache_dir) / "dev_before" / settings_digest(kept)


def measure_dev_before(rollout_fn, engine, dev: list[Question], max_new_tokens: int, folder: Path,
                       batch_invariant: bool, shared: Path | None, ranks: Ranks | None = None) -> None:
    """dev_before.json/.jsonl in ``folder``: copied from ``shared`` when another run measured the same start,
    else measured (and left in ``shared`` for the next run). On N ranks rank 0 decides, copies and writes."""
    ranks = ranks or Ranks()
    names = ("dev_before.json", "dev_before.jsonl")
    if ranks.broadcast(shared is not None and all((shared / n).exists() for n in names)):
        if ranks.main:
            for n in names:
                shutil.copyfile(shared / n, folder / n)
        return
    result = dev_evaluation(rollout_fn, engine, dev, max_new_tokens, folder / names[1], batch_invariant, ranks)
    if not ranks.main:
        return
    write_json(folder / names[0], result)
    if shared is not None:
        shared.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / names[1], shared / names[1])
        shutil.copyfile(folder / names[0], shared / names[0])  # last: its presence says the pair is whole


def resumed_rows(history: list[dict[str, float]], csv_path: Path) -> list[dict[str, float]]:
    """metrics.csv rows for the steps a resumed trainer already took: its checkpointed history, plus the
    wall-clock timings (``time/*``, kept out of the checkpoint), learning-curve points (``dev/*``, measured
    after the step's checkpoint) and judge calls so far (``calls/*``) read back from the csv the run wrote."""
    earlier = ({int(r["step"]): r for r in pd.read_csv(csv_path).to_dict("records")}
               if history and csv_path.exists() else {})
    return [{"step": i + 1, **h, **{k: v for k, v in earlier.get(i + 1, {}).items()
                                     if k.startswith(("time/", "dev/", "calls/")) and v == v}}
            for i, h in enumerate(history)]


def accumulated_timings(path: Path, seconds: float) -> dict:
    """timings.json after an invocation of ``seconds``: a resumed run adds to what its earlier invocations
    spent (the folder is keyed, so an earlier file there is this run's)."""
    earlier = read_json(path) if path.exists() else {}
    sessions = [*earlier.get("sessions_s", [earlier["wall_s"]] if "wall_s" in earlier else []), seconds]
    return {"wall_s": sum(sessions), "sessions_s": sessions}


class PolicyRun:
    """A ``train_policy`` run of ``variant`` in ``folder``, open from construction until :meth:`close` (or the end
    of a ``with`` block). ``roles`` maps a role name to a chat model (the variant's judges); ``toolbox`` is the
    agent's (:func:`components.retrieval.run_index.load_toolbox`). Attributes: ``parts`` (the variant's),
    ``settings`` (the run key's), ``options`` (the agent's: its warm start's, overridden by the variant's)."""

    def __init__(self, params: Params, variant: str, roles: Callable[[str], Any], toolbox: Any, folder: Path):
        self.params, self.variant, self.folder = params, variant, folder
        self.engine = self.policy = self.trainer = None
        self.ranks = current_ranks()  # rank 0 of 1 without a launcher
        try:
            # builders only construct (nothing is written before the folder is keyed); the key needs their agent
            self.parts = get_variant(variant)(VariantContext(params=params, roles=roles, toolbox=toolbox,
                                                             out_dir=folder))
            agent = self.parts.agent
            self.config = variant_grpo(params.grpo, self.parts)  # what it trains with (dapo's refill) is keyed
            refill = self.config.dynamic_sampling_max_rounds
            keyed = params if refill == (params.grpo.dynamic_sampling_max_rounds or 0) \
                else params.model_copy(update={"grpo": self.config})
            self.settings = run_settings(keyed, variant, agent)
            keyed_folder(folder, self.settings, ranks=self.ranks)  # rank 0 keys it before any rank writes
            if self.ranks.main:
                write_json(folder / "lineage.json", lineage_record(self.settings))
            if params.train_policy.branch_from is not None:
                check_branch(params.train_policy.branch_from, self.settings)
            self.spec = spec = run_spec(params)
            self.policy, self.tokenizer = warm_started_policy(spec, agent)
            warm = warm_start_adapter(spec, agent)
            self.engine = make_engine(spec, self.policy, self.tokenizer, [warm] if warm is not None else [])
            self.options = options = {**warm_start_options(spec, agent), **self.parts.agent_options}
            self.rollout_fn = make_agent_rollout(
                lambda p: build_agent(agent, lambda role: p, toolbox, params.agent, options), self.tokenizer)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def train(self, questions: list[Question], dev: list[Question],
              on_metrics: Callable[[int, dict[str, float]], None] | None = None,
              calls: Callable[[], int] | None = None) -> dict[str, float]:
        """Resume (or branch), measure ``dev_before`` unless the folder holds it, train to ``grpo.steps``, save
        the checkpoint and adapter/, measure ``dev_after``. ``on_metrics(step, metrics)`` sees every step's
        metrics as metrics.csv gets them. ``calls()`` counts the judge calls this process made (the pool's): each
        step's row gets the run's total so far, ``calls/judges`` (a resumed run adds to its csv's last). Returns
        the last step's metrics (rounded), with ``dev_before.*`` and ``dev_after.*`` when there are ``dev``
        questions."""
        params, folder, parts = self.params, self.folder, self.parts
        rows: list[dict[str, float]] = []
        calls_before = 0.0

        def log(step: int, metrics: dict[str, float]) -> None:
            if calls is not None:
                metrics = {**metrics, "calls/judges": calls_before + calls()}
            if rows and rows[-1]["step"] == step:  # the method's end-of-training metrics join the last step
                rows[-1].update(metrics)
            else:
                rows.append({"step": step, **metrics})
            if on_metrics is not None:
                on_metrics(step, metrics)
            pd.DataFrame(rows).to_csv(folder / "metrics.csv", index=False)  # kept current: a crash loses nothing
            write_rubrics(parts.method, folder / "rubrics", step)

        config = self.config
        if parts.order_prompts is not None:  # the variant's curriculum fixes the order
            questions, config = parts.order_prompts(questions), config.model_copy(update={"shuffle": False})
        self.trainer = trainer = GRPOTrainer(
            self.policy, self.engine, parts.reward_fn, questions, config, rollout_fn=self.rollout_fn,
            advantage_fn=parts.advantage_fn, loss_fn=parts.loss_fn, extra_modules=parts.extra_modules,
            method=parts.method, on_metrics=log, checkpoint_dir=folder / "ckpt", seed=params.seed,
            pad_token_id=self.tokenizer.pad_token_id or 0, zero=params.train_policy.deepspeed, ranks=self.ranks)
        branch = params.train_policy.branch_from
        started_from = trainer.resume_or_branch(branch)
        # a branch's first steps are the source run's (.../<run>/ckpt/step_N): their timings are in its csv
        csv_path = Path(branch).parent.parent / "metrics.csv" if started_from == "branch" else folder / "metrics.csv"
        rows[:] = resumed_rows(trainer.history, csv_path)
        calls_before = float(rows[-1].get("calls/judges", 0.0)) if rows else 0.0
        before_file = folder / "dev_before.json"
        invariant = params.train_policy.eval_batch_invariant
        ranks = self.ranks
        if dev and not ranks.broadcast(before_file.exists()):  # the folder is keyed: a measurement in it is of this run
            fresh = started_from == "fresh" and invariant
            shared = shared_dev_before(params, self.settings, parts.agent, self.options, dev) if fresh else None
            with trainer.whole_weights():  # ZeRO-3 on N ranks: each rank plays its share on the gathered weights
                measure_dev_before(self.rollout_fn, self.engine, dev, config.max_new_tokens, folder, invariant,
                                   shared, ranks)
        def curve_point(step: int) -> dict[str, float]:
            with trainer.whole_weights():
                found = dev_evaluation(self.rollout_fn, self.engine, dev, config.max_new_tokens,
                                       folder / "dev_curve" / f"step_{step:05d}.jsonl", invariant, ranks)
            return {f"dev/{k}": v for k, v in found.items() if k != "batch_invariant"}

        history = trainer.train(params.grpo.steps, progress=f"train_policy@{self.variant}" if ranks.main else None,
                                evaluate_every=params.train_policy.eval_every if dev else 0, evaluate=curve_point)
        trainer.save()
        with trainer.stepper.full_weights():  # ZeRO-3: every rank gathers the weights rank 0 writes
            if ranks.main:
                save_adapter(self.policy.model, folder / "adapter")
                if not (folder / "adapter" / "adapter_config.json").exists():  # full fine-tuning: a whole model,
                    self.tokenizer.save_pretrained(folder / "adapter")  # servable by itself (evaluate@<variant>)
        last = {k: round(float(v), 6) for k, v in history[-1].items()} if history else {}
        if dev:
            with trainer.whole_weights():
                after = dev_evaluation(self.rollout_fn, self.engine, dev, config.max_new_tokens,
                                       folder / "dev_after.jsonl", invariant, ranks)
            before = ranks.broadcast(read_json(before_file) if ranks.main else None)
            last.update({f"dev_before.{k}": round(v, 6) for k, v in before.items()})
            last.update({f"dev_after.{k}": round(v, 6) for k, v in after.items()})
            gaming = gaming_check([before, *history, after])
            if history and ranks.main:
                log(int(history[-1].get("step", len(history))), gaming.metrics)
            last.update({k: round(v, 6) for k, v in gaming.metrics.items()})
            if gaming.suspected and ranks.main:
                logger.warning("%s: %s", folder, gaming.message)
        return last

    def close(self) -> None:
        """Close the engine and hand the run's memory back to the OS: a process that runs several (a sweep's
        thread runner, a reused Ray worker) otherwise keeps the peak of each (glibc keeps freed torch buffers in
        its arenas; the second GRPO run of one sweep process was killed for memory at 24 GB)."""
        if self.engine is not None and hasattr(self.engine, "close"):
            self.engine.close()
        method = getattr(self.trainer, "method", None)
        if hasattr(method, "close"):  # a method's own engines (ARCO's mu writing on llama.cpp)
            method.close()
        self.engine = self.policy = self.trainer = None  # dropped before the memory goes back
        release(min_growth_gb=0)
