"""RubricEM's training variants (paper 3.2-3.4, Algorithm 1) on the one GRPO trainer, all rolling out through the
``scaffold`` agent from the scaffold-SFT policy: ``scaffold_grpo`` (the answer-only baseline: token F1, -1 when the
format breaks), ``ss_grpo`` (stagewise judge scores, Lambda returns, per-stage normalisation), ``meta_policy``
(answer-only GRPO plus the reflection meta-policy and the rubric bank) and ``rubricem`` (both); the method state
that carries the judge's buffers, the rubric bank and the deferred reflection batch through checkpoints; and the
windowed curriculum (D.3) as a prompt order. The order of a step and where it differs from Algorithm 1:
:class:`ReflectionBranch` and docs/methods/rubricem.md.

    python -m tasks.train_policy --variant rubricem
"""

from __future__ import annotations

import asyncio
import logging
import random
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from components.judges.call import scored_as
from components.judges.render import scaffold_text
from components.methods.rubricem.reflection import Reflection, ReflectionJudge, parse_reflection, reflection_messages
from components.methods.rubricem.stagewise_judge import StagewiseJudge, failure_kind
from components.variants import VARIANTS, VariantContext, VariantParts
from components.rewards.outcome import outcome_reward
from components.methods.rubricem.stage_returns import StageReturns, StagewiseReward
from components.methods.rubricem.bank import BANK_FILE, PHASE_KEY, BankGuidance, RubricBank
from components.schemas import Criterion, Question, Rubric
from components.training.grpo.advantages import group_advantages, place_episode_advantages
from components.training.grpo.agent_rollout import chat_template_renderer
from components.training.grpo.episodes import Episode, StepContext
from components.training.engines.rollout import RolloutSegment, assemble

__all__ = ["LazyEmbedder", "MetaPolicyFirst", "ReflectionBranch", "ReflectionJob", "RubricEMState",
           "windowed_curriculum"]

log = logging.getLogger(__name__)


def windowed_curriculum(questions: list[Question], batch_size: int, window: int = 3) -> list[Question]:
    """The prompt order of the windowed curriculum: per window, ``window`` fresh batches (tagged ``cross``)
    then the same batches again in the same order (tagged ``within``). A short last batch is filled with
    questions from the start, so every step's batch stays whole. The trainer keeps this order only with
    ``grpo.shuffle: false``."""
    if not questions:
        return []
    batches = [list(questions[i:i + batch_size]) for i in range(0, len(questions), batch_size)]
    batches[-1] += [questions[i % len(questions)] for i in range(batch_size - len(batches[-1]))]

    def tag(q: Question, phase: str) -> Question:
        return q.model_copy(update={"metadata": {**q.metadata, PHASE_KEY: phase}})

    order: list[Question] = []
    for start in range(0, len(batches), window):
        chunk = batches[start:start + window]
        order += [tag(q, "cross") for batch in chunk for q in batch]
        order += [tag(q, "within") for batch in chunk for q in batch]
    return order


class LazyEmbedder:
    """A sentence embedder loaded on its first ``encode`` (the bank is built before anything is embedded)."""

    def __init__(self, name: str):
        self.name, self._model = name, None

    def encode(self, sentences: list[str]) -> Any:
        if self._model is None:
            from components.retrieval.dense import EMBEDDED_MINILM, resolve_embedder

            if self.name == EMBEDDED_MINILM:
                self._model = resolve_embedder(self.name)
            else:
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(self.name, device="cpu")
        return self._model.encode(sentences)


# ------------------------------------------------------------------------------------ reflection branch


@dataclass
class ReflectionJob:
    """One question's reflection work: the sampled trajectory, its grading, the candidates and their scores."""

    question: Question
    trajectory: str
    feedback: str
    prompt_ids: list[int]
    candidates: list[tuple[list[int], list[float] | None, str]]  # sampled ids, their log-probs, text
    scores: list[float | None] | None = None
    error: str | None = None
    final_answer: str | None = None  # the reflected trajectory's, withheld from its reflections with the gold

    @property
    def parsed(self) -> list[Reflection]:
        withheld = [*self.question.answers, *([self.final_answer] if self.final_answer else [])]
        return [parse_reflection(text, withheld) for _, _, text in self.candidates]

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question.model_dump(mode="json"), "trajectory": self.trajectory,
                "feedback": self.feedback, "prompt_ids": self.prompt_ids,
                "candidates": [list(c) for c in self.candidates], "scores": self.scores, "error": self.error,
                "final_answer": self.final_answer}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReflectionJob:
        return cls(Question.model_validate(data["question"]), data["trajectory"], data["feedback"],
                   list(data["prompt_ids"]), [(list(i), lp, t) for i, lp, t in data["candidates"]], data["scores"],
                   data["error"], data.get("final_answer"))


def _feedback(episode: Episode, score_row: torch.Tensor) -> str:
    judged = episode.info.get("stagewise")
    if judged is not None:
        return judged.feedback()
    answer = episode.info["trajectory"].final_answer
    return f"Final answer {answer!r}; outcome reward (token F1, -1 if the format broke): {float(score_row[0]):.2f}"


class ReflectionBranch:
    """The reflection meta-policy's part of step N, in the order of D.1-D.2 and Algorithm 1 (lines 9-30): (1) step
    N's task rollouts, the bank guidance reading the bank as it stands; (2) Phase A (:class:`MetaPolicyFirst`,
    before the step's reward): join the judging of step N-1's candidates, write each question's best valid
    reflection into the bank, run one GRPO update of the backbone on every scored candidate's reflection tokens
    (the trajectory is fixed context) and refresh the rollout engine; (3) the step's reward and task update, from
    the weights Phase A left; (4) ``on_step_end``: one trajectory per question drawn (seeded), ``m`` candidates
    sampled with the rollout engine, their judging in a background thread while step N+1 rolls out. Phase A's time
    counts as ``time/reward``. With ``grpo.old_logprobs: auto`` and one epoch the task update takes the current
    log-probs as the old ones; ``engine`` keeps the rollout's. A checkpoint waits for pending judging, and the
    resumed run applies that batch in its next Phase A; driven through ``step_end`` alone (no reward wrapper) a
    batch still waiting is applied at the end of the next step. With ``defer_reflection: false`` the candidates are
    judged, written and trained on at the end of step N. ``RubricEMState.on_train_end`` applies the last batch."""

    def __init__(self, judge: ReflectionJudge, bank: RubricBank, *, candidates: int = 8, temperature: float = 0.7,
                 max_tokens: int = 512, reflect_on_repeat: bool = False, defer: bool = True, seed: int = 0,
                 observation_chars: int | None = None):
        self.judge, self.bank, self.m = judge, bank, candidates
        self.observation_chars = observation_chars
        self.temperature, self.max_tokens = temperature, max_tokens
        self.reflect_on_repeat, self.defer, self.seed = reflect_on_repeat, defer, seed
        self.pending: Future | None = None
        self.ready: list[ReflectionJob] | None = None
        self.phase_a_metrics: dict[str, float] = {}  # Phase A's metrics, reported with the step's end
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reflection-judge") if defer else None

    def generate(self, trainer: Any, ctx: StepContext, episodes: list[Episode], scores: torch.Tensor) -> list[ReflectionJob]:
        """Sample ``m`` reflection candidates for one uniformly drawn trajectory of each question of the step."""
        tokenizer = getattr(trainer.engine, "tokenizer", None)
        if tokenizer is None:
            raise ValueError("the rollout engine has no tokenizer: reflections are rendered with its chat template")
        render = chat_template_renderer(tokenizer)
        members: dict[int, list[int]] = {}
        for i, e in enumerate(episodes):
            members.setdefault(e.group, []).append(i)
        jobs = []
        for group, idx in members.items():
            question = episodes[idx[0]].prompt
            if question.metadata.get(PHASE_KEY) == "within" and not self.reflect_on_repeat:
                continue
            pick = random.Random(f"{self.seed}/{ctx.step}/{group}").choice(idx)
            text = scaffold_text(episodes[pick].info["trajectory"])
            messages = reflection_messages(question, text, observation_chars=self.observation_chars)
            prompt = list(tokenizer.encode(render(messages, True), add_special_tokens=False))
            jobs.append(ReflectionJob(question, text, _feedback(episodes[pick], scores[pick]), prompt, [],
                                      final_answer=episodes[pick].info["trajectory"].final_answer))
        if jobs:
            sampling = replace(trainer.sampling, max_new_tokens=self.max_tokens, temperature=self.temperature,
                               stop_strings=())
            gens = trainer.engine.generate([j.prompt_ids for j in jobs for _ in range(self.m)], sampling)
            for n, g in enumerate(gens):
                text = g.text if g.text is not None else tokenizer.decode(g.token_ids, skip_special_tokens=True)
                jobs[n // self.m].candidates.append((list(g.token_ids), g.logprobs, text))
        return jobs

    def judge_all(self, jobs: list[ReflectionJob]) -> list[ReflectionJob]:
        """Score every job's candidates, all calls concurrent, on this thread's own event loop."""

        async def run() -> list[tuple[list[float | None], str | None]]:
            return list(await asyncio.gather(*(self.judge.score(j.question, j.trajectory, j.feedback, j.parsed)
                                               for j in jobs)))

        for job, (scores, error) in zip(jobs, asyncio.run(run())):
            job.scores, job.error = scores, error
        return jobs

    def _collect(self) -> list[ReflectionJob] | None:
        if self.pending is not None:
            self.ready, self.pending = self.pending.result(), None
        ready, self.ready = self.ready, None
        return ready

    def apply(self, trainer: Any, ctx: StepContext, jobs: list[ReflectionJob]) -> dict[str, float]:
        """Write each question's best valid reflection to the bank; GRPO on every scored candidate's tokens."""
        rows, values, groups = [], [], []
        metrics = {"reflection/questions": float(len(jobs)), "reflection/judge_failures": 0.0,
                   "reflection/bank_writes": 0.0, "reflection/bank_overwrites": 0.0, "reflection/valid_fraction": 0.0}
        best, valid_count, total = [], 0, 0
        for j, job in enumerate(jobs):
            parsed = job.parsed
            total += len(parsed)
            valid_count += sum(p.valid for p in parsed)
            for p in parsed:
                if p.reason is not None:
                    key = f"reflection/invalid/{p.reason}"
                    metrics[key] = metrics.get(key, 0.0) + 1.0
            if job.scores is None or all(s is None for s in job.scores):
                metrics["reflection/judge_failures"] += 1
                why = job.error or "no scores"
                key = f"reflection/judge_failure/{failure_kind(why)}"
                metrics[key] = metrics.get(key, 0.0) + 1.0
                log.warning("reflection judge failed for %s: %s", job.question.id, why)
                continue
            scored = [(s, n) for n, (s, p) in enumerate(zip(job.scores, parsed)) if p.valid and s is not None]
            rated = [s for s in job.scores if s is not None]
            if len(rated) > 1 and max(rated) == min(rated):  # the judge rated every candidate alike: no signal
                metrics["reflection/flat_groups"] = metrics.get("reflection/flat_groups", 0.0) + 1.0
            if scored:
                score, n = max(scored, key=lambda x: (x[0], -x[1]))
                overwrote = self.bank.put(job.question.question, rubrics=parsed[n].rubrics,
                                          takeaways=parsed[n].takeaways, step=ctx.step, score=score,
                                          question_id=job.question.id)
                metrics["reflection/bank_writes"] += 1
                metrics["reflection/bank_overwrites"] += float(overwrote)
                best.append(score)
            for (ids, logprobs, _), score in zip(job.candidates, job.scores):
                if score is not None and ids:
                    rows.append([RolloutSegment(job.prompt_ids, False), RolloutSegment(ids, True, logprobs, 0)])
                    values.append(score)
                    groups.append(j)
        metrics["reflection/valid_fraction"] = valid_count / total if total else 0.0
        if best:
            metrics["reflection/best_score"] = sum(best) / len(best)
        if rows:
            config = trainer.config
            adv = group_advantages(torch.tensor(values), groups, normalize_std=config.std_normalize, eps=config.adv_eps)
            batch = assemble(rows, pad_token_id=trainer.pad_token_id, max_length=trainer.max_length)
            token_adv, batch.loss_mask = place_episode_advantages(adv, list(range(len(rows))), batch.segment_ids,
                                                                  batch.loss_mask)
            metrics["reflection/updated"] = 0.0
            if bool(batch.loss_mask.any()) and bool(adv.abs().sum() > 0):
                update = trainer.update(batch, token_adv, row_episode=list(range(len(rows))), ctx=ctx)
                trainer.engine.update_weights(trainer.policy, ctx.step)
                metrics.update({f"reflection/{k}": v for k, v in update.items()})
                metrics["reflection/updated"] = 1.0
        return metrics

    def phase_a(self, trainer: Any, ctx: StepContext) -> dict[str, float]:
        """D.2's Phase A at step N, before the task update: join the judging of step N-1's candidates, write
        the bank, train the backbone on them. Nothing waiting (the first step, synchronous mode): no-op."""
        previous = self._collect()
        metrics = self.apply(trainer, ctx, previous) if previous else {}
        self.phase_a_metrics.update(metrics)
        return metrics

    def step_end(self, trainer: Any, ctx: StepContext, episodes: list[Episode], scores: torch.Tensor) -> dict[str, float]:
        metrics, self.phase_a_metrics = self.phase_a_metrics, {}
        previous = self._collect()  # a batch no Phase A took (the branch driven without the reward wrapper)
        if previous:
            metrics.update(self.apply(trainer, ctx, previous))
        jobs = self.generate(trainer, ctx, episodes, scores)
        if jobs and self._executor is not None:
            self.pending = self._executor.submit(self.judge_all, jobs)
        elif jobs:
            metrics.update(self.apply(trainer, ctx, self.judge_all(jobs)))
        return metrics

    def flush(self, trainer: Any, ctx: StepContext) -> dict[str, float]:
        """Apply the batch still waiting after the last step (its judging is awaited): otherwise the final
        step's reflections would never reach the bank or the backbone."""
        ready = self._collect()
        return self.apply(trainer, ctx, ready) if ready else {}

    def state_dict(self) -> dict[str, Any]:
        """The finished reflection batch not yet trained on (pending judging is awaited first)."""
        if self.pending is not None:
            self.ready, self.pending = self.pending.result(), None
        return {"ready": None if self.ready is None else [j.to_json() for j in self.ready]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        ready = (state or {}).get("ready")
        self.pending, self.ready = None, None if ready is None else [ReflectionJob.from_json(j) for j in ready]


# ------------------------------------------------------------------------------------ method state


class RubricEMState:
    """Judge buffers, rubric bank and reflection branch of one run; saved inside every checkpoint (the bank as
    a file), the bank also snapshotted to ``bank_dir`` every ``save_every`` steps."""

    not_data_parallel = ("its Phase A trains the policy on the reflection batch inside the next step's reward, on the "
                         "rank that calls it: each rank would have to train its own share of that batch in step "
                         "with the others (the bank and the batch would travel from rank 0 as ARCO's mu does)")

    def __init__(self, judge: StagewiseJudge | None = None, bank: RubricBank | None = None,
                 reflection: ReflectionBranch | None = None, bank_dir: str | Path | None = None, save_every: int = 10):
        self.judge, self.bank, self.reflection = judge, bank, reflection
        self.bank_dir, self.save_every = (Path(bank_dir) if bank_dir is not None else None), save_every
        self.trainer: Any = None

    def attach(self, trainer: Any) -> None:
        """Keep the trainer (it calls this once when built): Phase A updates its policy before its task update."""
        self.trainer = trainer

    def before_task_update(self, ctx: StepContext) -> dict[str, float]:
        """Phase A of the step (D.2): the deferred reflection batch lands in the bank and the backbone."""
        if self.reflection is None:
            return {}
        if self.trainer is None:
            raise RuntimeError("RubricEMState.before_task_update needs the trainer: build the GRPOTrainer with "
                               "this state as its method (it calls attach)")
        return self.reflection.phase_a(self.trainer, ctx)

    def state_dict(self) -> dict[str, Any]:
        return {"judge": self.judge.state_dict() if self.judge else None,
                "reflection": self.reflection.state_dict() if self.reflection else None,
                "bank_entries": len(self.bank) if self.bank is not None else 0}

    def write_files(self, folder: Path) -> None:
        if self.bank is not None:
            self.bank.save(Path(folder) / BANK_FILE)

    def rubrics(self) -> list[Rubric]:
        """The judge's per-question buffers and the bank's reflections, in the shared rubric type (a bank entry's
        rubric block one criterion per line)."""
        out = [buffer.as_rubric() for _, buffer in sorted(self.judge.buffers.items())] if self.judge else []
        if self.bank is not None:
            out += [Rubric(id=f"bank:{e.question_id or e.key[:12]}", source=f"rubricem rubric bank (step {e.step})",
                           criteria=[Criterion(text=line.strip(" -*\t"), kind="reflection")
                                     for line in e.rubrics.splitlines() if line.strip(" -*\t")])
                    for _, e in sorted(self.bank.entries.items())]
        return out

    def load_state_dict(self, state: dict[str, Any] | None, files_dir: Path | None) -> None:
        state = state or {}
        if self.judge is not None:
            self.judge.load_state_dict(state.get("judge"))
        if self.reflection is not None:
            self.reflection.load_state_dict(state.get("reflection"))
        if self.bank is not None:
            path = None if files_dir is None else Path(files_dir) / BANK_FILE
            if path is not None and path.exists():
                self.bank.load(path)
            elif state.get("bank_entries"):
                raise FileNotFoundError(f"checkpoint state lists {state['bank_entries']} bank entries but "
                                        f"{path} is missing")
            else:
                self.bank.clear()

    def on_step_end(self, trainer: Any, ctx: StepContext, episodes: list[Episode], scores: torch.Tensor) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.reflection is not None:
            metrics.update(self.reflection.step_end(trainer, ctx, episodes, scores))
        if self.bank is not None:
            metrics["bank/size"] = float(len(self.bank))
            for mode in ("within", "cross"):
                seen = [r for e in episodes if (r := e.info["trajectory"].metadata.get("retrieval", {})).get("mode") == mode]
                if seen:
                    metrics[f"bank/{mode}_hit_rate"] = sum(bool(r["hit"]) for r in seen) / len(seen)
            if ctx.step % self.save_every == 0:
                self._snapshot(ctx.step)
        return metrics

    def on_train_end(self, trainer: Any, ctx: StepContext) -> dict[str, float]:
        """The last step's reflections land (bank writes and one update); the final bank is snapshotted."""
        if self.reflection is None:
            return {}
        metrics = self.reflection.flush(trainer, ctx)
        if metrics and self.bank is not None:
            metrics["bank/size"] = float(len(self.bank))
            self._snapshot(ctx.step)
        return metrics

    def _snapshot(self, step: int) -> None:
        if self.bank is not None and self.bank_dir is not None:
            self.bank.save(self.bank_dir / f"step_{step:06d}" / BANK_FILE)


class MetaPolicyFirst:
    """The step's reward, preceded by Phase A (:meth:`RubricEMState.before_task_update`): the trainer calls its
    reward after the rollouts and before the task update, which is where D.2 puts the deferred meta-policy
    update. ``reward`` is the variant's own reward (stagewise or outcome), returned as it answers (sync or
    async). A trainer that calls the reward again within a step (a refill draw) finds nothing left waiting,
    so Phase A runs once per step."""

    def __init__(self, reward: Any, state: RubricEMState):
        self.reward, self.state = reward, state

    def __call__(self, episodes: list[Episode], ctx: StepContext) -> Any:
        self.state.before_task_update(ctx)
        return self.reward(episodes, ctx)


# ------------------------------------------------------------------------------------ variants


def _build(ctx: VariantContext, *, stagewise: bool, meta: bool) -> VariantParts:
    p, grpo = ctx.params.rubricem, ctx.params.grpo
    judge = reward = advantage_fn = bank = reflection = None
    if stagewise:
        judge = StagewiseJudge(ctx.roles(p.generator_role), scored_as(ctx.roles(p.judge_role), p.score_from),
                               caps=p.stage_caps, targets=p.rubric_targets, max_tokens=p.judge_max_tokens,
                               stage_chars=p.stage_chars, answer_weight=p.answer_weight, scoring=p.judge_scoring,
                               seed=ctx.params.seed)
        reward = StagewiseReward(judge)
        advantage_fn = StageReturns(p.stage_lambda, normalize_std=grpo.std_normalize, eps=grpo.adv_eps)
    options: dict[str, Any] = {"max_tokens": p.scaffold_max_tokens}
    if meta:
        bank = RubricBank(ctx.embedder or LazyEmbedder(p.bank_embedder), top_k=p.bank_top_k)
        reflection = ReflectionBranch(
            ReflectionJudge(ctx.roles(p.reflection_judge_role), p.reflection_weights, max_tokens=p.judge_max_tokens),
            bank, candidates=p.reflection_candidates, temperature=p.reflection_temperature,
            max_tokens=p.reflection_max_tokens, reflect_on_repeat=p.reflect_on_repeat, defer=p.defer_reflection,
            seed=ctx.params.seed, observation_chars=p.reflection_observation_chars)
        options["guidance"] = BankGuidance(bank)
    method = RubricEMState(judge, bank, reflection, bank_dir=ctx.out_dir / "bank", save_every=p.bank_save_every)
    reward = reward or outcome_reward(ctx.params.grpo)
    order = None
    if meta:  # Phase A before the task update (D.2); the windowed curriculum (D.3): fresh batches, then repeats
        reward = MetaPolicyFirst(reward, method)
        batch = ctx.params.grpo.prompts_per_step
        order = lambda questions: windowed_curriculum(questions, batch, p.curriculum_window)
    return VariantParts(reward_fn=reward, advantage_fn=advantage_fn,
                        method=method if (judge is not None or bank is not None) else None, agent="scaffold",
                        agent_options=options, order_prompts=order)


@VARIANTS.register("scaffold_grpo")
def build_scaffold_grpo(ctx: VariantContext) -> VariantParts:
    return _build(ctx, stagewise=False, meta=False)


@VARIANTS.register("ss_grpo")
def build_ss_grpo(ctx: VariantContext) -> VariantParts:
    return _build(ctx, stagewise=True, meta=False)


@VARIANTS.register("meta_policy")
def build_meta_policy(ctx: VariantContext) -> VariantParts:
    return _build(ctx, stagewise=False, meta=True)


@VARIANTS.register("rubricem")
def build_rubricem(ctx: VariantContext) -> VariantParts:
    return _build(ctx, stagewise=True, meta=True)
