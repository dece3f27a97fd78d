"""ARBOR and its rubric baselines as `train_policy` variants (ARBOR paper 3.2-3.4, 4.4; params section ``arbor``):

- ``arbor``: each step activates common rubrics from the rubric memory, scores every query-group under them
  by sparse pairwise judging and shapes the outcome reward with them; meanwhile each group with an outcome
  contrast induces drafts, which are judged on their own group for admission, and the memory runs its
  lifecycle (admission, consolidation, retirement) in the method's ``on_step_end``;
- ``arbor_no_memory``: the same induction, but the drafts that pass admission shape their own group's reward
  and are then discarded;
- ``rar``: a static checklist per question from the question and reference answer, a holistic 1-10 rating
  of each trajectory against it, centred in the group and added with the same lambda (no variance filter,
  no attenuation: C.3 describes neither for this baseline).

    python -m tasks.train_policy --variant arbor

Every variant keeps R_base = token F1 if format-valid else -1 (:class:`components.rewards.outcome.OutcomeReward`)
and adds the rubric term of :func:`components.methods.arbor.shaping.shape_group`. Step metrics (under
``reward/``): judge calls, failures, removed edges and tokens per group, induction outcomes, the zero-variance
group fractions under R_base and R_total; under ``method/``: memory size, admissions, consolidations,
retirements and reuse. The memory is saved in every checkpoint (``method/state.json`` and
``method/files/memory.json``) and as ``<out_dir>/memory/step_NNNNN.json`` each step it changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from components.io import write_json
from components.judges.call import Tally, scored_as
from components.judges.render import trajectory_text
from components.llm.base import ChatModel
from components.methods.arbor.contrast import InductionPlan, plan_induction
from components.methods.arbor.induction import consolidate, induce
from components.methods.arbor.memory import GroupRecord, RubricMemory, RubricText, admission
from components.methods.arbor.pairwise_graph import sparse_graph
from components.methods.arbor.pairwise_judge import GroupScores, score_group
from components.methods.arbor.params import ArborParams
from components.methods.arbor.rar import rate, write_checklist
from components.methods.arbor.shaping import homogeneity_metrics, shape_group
from components.rewards.outcome import OutcomeReward, format_valid, outcome_reward
from components.training.grpo.episodes import Episode, RewardOutput, StepContext
from components.variants import VARIANTS, VariantContext, VariantParts

__all__ = ["ArborReward", "ArborState", "RarReward", "RarState", "lazy_embedder"]


@dataclass
class _Outcomes:
    """The outcome side of a step: base reward, format validity, format-gated F1, response length."""

    base: list[float]
    valid: list[bool]
    f1: list[float]
    lengths: list[int]
    groups: dict[int, list[int]]
    metrics: dict[str, float]


def _outcomes(episodes: list[Episode], ctx: StepContext, outcome: OutcomeReward) -> _Outcomes:
    out = outcome(episodes, ctx)
    base = [float(s) for s in out.scores]
    valid = [format_valid(e.info["trajectory"]) for e in episodes]
    groups: dict[int, list[int]] = {}
    for i, e in enumerate(episodes):
        groups.setdefault(e.group, []).append(i)
    return _Outcomes(base, valid, [b if v else 0.0 for b, v in zip(base, valid, strict=True)],
                     [len(e.response_ids) or len(e.text or "") for e in episodes], groups, dict(out.metrics))


def _pick(values: Sequence[Any], members: Sequence[int]) -> list[Any]:
    return [values[i] for i in members]


def _tally_metrics(prefix: str, tally: Tally, n_groups: int) -> dict[str, float]:
    per = max(n_groups, 1)
    return {f"{prefix}/calls": float(tally.calls), f"{prefix}/failures": float(tally.failures),
            f"{prefix}/unparsed": float(tally.unparsed), f"{prefix}/tokens": float(tally.tokens),
            f"{prefix}/calls_per_group": tally.calls / per, f"{prefix}/tokens_per_group": tally.tokens / per,
            **{f"{prefix}/{k}": float(v) for k, v in tally.scoring().items()}}  # once probabilities are asked for


def lazy_embedder(ctx: VariantContext, name: str) -> Callable[[list[str]], np.ndarray]:
    """Unit-norm sentence embeddings; the embedder (``ctx.embedder`` or the named one) loads on first use."""
    from components.retrieval.dense import embed, resolve_embedder

    holder: list[Any] = [ctx.embedder]

    def run(texts: list[str]) -> np.ndarray:
        if holder[0] is None:
            holder[0] = resolve_embedder(name)
        return embed(holder[0], texts)

    return run


# ---------------------------------------------------------------- ARBOR


@dataclass
class _GroupResult:
    members: list[int]
    plan: InductionPlan
    active: dict[str, GroupScores] = field(default_factory=dict)
    drafts: list[tuple[RubricText, GroupScores]] | None = None  # None: the induction call failed


class ArborState:
    """The rubric memory as the run's method state: checkpointed, snapshotted, lifecycle after each step."""

    def __init__(self, memory: RubricMemory, consolidator: ChatModel, settings: ArborParams,
                 snapshot_dir: Path | None = None):
        self.memory, self.consolidator, self.settings = memory, consolidator, settings
        self.snapshot_dir = snapshot_dir
        self.pending: tuple[list[str], list[GroupRecord]] | None = None  # the step's observations, from the reward

    def state_dict(self) -> dict[str, Any]:
        return self.memory.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None, files_dir: Path | None = None) -> None:
        self.memory.load_state_dict(state)

    def write_files(self, folder: Path) -> None:
        write_json(Path(folder) / "memory.json", self.memory.state_dict())

    def rank_share(self) -> tuple[list[str], list[GroupRecord]] | None:
        """This rank's observations of the draw (its groups' records), taken: :meth:`merge_ranks` puts back the
        whole draw's, so rank 0's lifecycle (consolidation calls included) sees every group, once."""
        share, self.pending = self.pending, None
        return share

    def merge_ranks(self, parts: list[tuple[list[str], list[GroupRecord]] | None]) -> None:
        """Every rank's observations in rank order (the groups' order in one process); the active rubrics are
        the memory's choice, the same on every rank (a rank without prompts has none)."""
        given = [p for p in parts if p is not None]
        self.pending = (list(dict.fromkeys(i for active, _ in given for i in active)),
                        [r for _, records in given for r in records]) if given else None

    def _contents(self) -> tuple[list[str], list[str]]:
        return [d.id for d in self.memory.drafts], [r.id for r in self.memory.common]

    async def on_step_end(self, trainer: Any, ctx: StepContext, episodes: list[Episode], scores: Any) -> dict[str, float]:
        before = self._contents()
        active, records = self.pending or ([], [])
        self.pending = None
        events = self.memory.apply_step(ctx.step, active, records)
        metrics = {"admitted": float(events.admitted), "activations": float(events.activations),
                   "retired": float(len(events.retired)),
                   "retired_low_variance": float(sum(r == "low_variance" for _, r in events.retired)),
                   "retired_low_correlation": float(sum(r == "low_correlation" for _, r in events.retired))}
        metrics.update({f"rejected_{k}": float(v) for k, v in events.rejected.items()})
        tally = Tally()
        if self.memory.needs_consolidation():
            new = await consolidate(self.consolidator, self.memory.drafts, [r.rubric for r in self.memory.common],
                                    self.settings.max_new_common, tally, max_tokens=self.settings.writer_max_tokens)
            if new is not None:  # a failed call keeps D and tries again after the next step
                done = self.memory.consolidate(new, ctx.step)
                metrics.update({"consolidated": 1.0, "consolidation_added": float(len(done.added)),
                                "consolidation_duplicates": float(done.duplicates),
                                "consolidation_replaced": float(len(done.replaced)),
                                "consolidation_dropped_full": float(done.dropped_full)})
        metrics.update({"consolidation_calls": float(tally.calls),
                        "consolidation_failures": float(tally.failures + tally.unparsed),
                        "consolidation_tokens": float(tally.tokens)})
        metrics.update(self.memory.metrics())
        changed = self._contents() != before
        metrics["memory_changed"] = float(changed)
        if changed and self.snapshot_dir is not None:
            write_json(self.snapshot_dir / f"step_{ctx.step:05d}.json", self.memory.state_dict())
        return metrics


@dataclass
class ArborReward:
    """R_total for arbor (``state`` given: common rubrics shape, drafts go to the memory) or arbor_no_memory
    (``state`` None: admitted drafts shape their own group and are dropped)."""

    settings: ArborParams
    judge: ChatModel
    inducer: ChatModel
    seed: int
    state: ArborState | None = None
    outcome: OutcomeReward = field(default_factory=OutcomeReward)

    async def _score(self, question: str, texts: list[str], edges: list, rubric: RubricText, key: str,
                     tally: Tally) -> GroupScores:
        result = await score_group(self.judge, question, texts, edges, rubric, key, self.settings.judge_max_tokens,
                                   form=self.settings.judge_form)
        tally.merge(result.tally)
        return result

    async def _group(self, step: int, group: int, members: list[int], episodes: list[Episode], o: _Outcomes,
                     active: list, judge_tally: Tally, induce_tally: Tally) -> _GroupResult:
        s = self.settings
        question = episodes[members[0]].prompt
        texts = [trajectory_text(episodes[i].info["trajectory"], s.observation_chars) for i in members]
        f1, base = _pick(o.f1, members), _pick(o.base, members)
        edges = sparse_graph(base)
        plan = plan_induction(f1, _pick(o.lengths, members), _pick(o.valid, members))
        key = f"{self.seed}:{step}:{group}"
        result = _GroupResult(members, plan)

        async def drafts() -> list[tuple[RubricText, GroupScores]] | None:
            existing = [r.rubric for r in self.state.memory.common] if self.state is not None else []
            written = await induce(self.inducer, question.question, texts, f1, plan, existing, s.max_drafts,
                                   induce_tally, answers=question.answers if s.show_answer else None,
                                   max_tokens=s.writer_max_tokens)
            if written is None:
                return None
            scored = await asyncio.gather(*(self._score(question.question, texts, edges, d, f"{key}:draft{k}",
                                                        judge_tally) for k, d in enumerate(written)))
            return list(zip(written, scored, strict=True))

        jobs = [self._score(question.question, texts, edges, r.rubric, f"{key}:{r.id}", judge_tally) for r in active]
        *scored, result.drafts = await asyncio.gather(*jobs, drafts())
        result.active = {r.id: g for r, g in zip(active, scored, strict=True)}
        return result

    async def __call__(self, episodes: list[Episode], ctx: StepContext) -> RewardOutput:
        s = self.settings
        o = _outcomes(episodes, ctx, self.outcome)
        active = self.state.memory.choose_active() if self.state is not None else []
        judge_tally, induce_tally = Tally(), Tally()
        results = await asyncio.gather(*(self._group(ctx.step, g, m, episodes, o, active, judge_tally, induce_tally)
                                         for g, m in o.groups.items()))
        total = list(o.base)
        metrics = dict(o.metrics)
        counts = {"filtered_rubrics": 0, "shaped_groups": 0, "unscored_trajectories": 0, "removed_edges": 0,
                  "drafts": 0, "draft_admitted": 0, "induction_failed": 0}
        reasons: dict[str, int] = {}
        records, homogeneity = [], []
        for r in results:
            f1, valid, base = _pick(o.f1, r.members), _pick(o.valid, r.members), _pick(o.base, r.members)
            reasons[r.plan.reason] = reasons.get(r.plan.reason, 0) + 1
            counts["induction_failed"] += r.drafts is None
            drafts = r.drafts or []
            counts["drafts"] += len(drafts)
            counts["removed_edges"] += sum(g.removed_edges for g in [*r.active.values(), *(d for _, d in drafts)])
            if self.state is not None:
                shaping = [g.scores for g in r.active.values()]
                q = episodes[r.members[0]].prompt
                records.append(GroupRecord(q.id, q.question, f1, {k: g.scores for k, g in r.active.items()},
                                           [(t, g.scores) for t, g in drafts]))
            else:
                shaping = [g.scores for _, g in drafts if admission(g.scores, f1, s.delta_v, s.rho_min).admitted]
                counts["draft_admitted"] += len(shaping)
            shaped = shape_group(base, valid, shaping, lam=s.shaping_lambda, alpha=s.alpha, delta_v=s.delta_v)
            counts["filtered_rubrics"] += len(shaping) - len(shaped.kept)
            counts["shaped_groups"] += bool(shaped.kept)
            counts["unscored_trajectories"] += shaped.unscored
            for i, value in zip(r.members, shaped.total, strict=True):
                total[i] = value
            homogeneity.append((f1, valid, base, shaped.total))
        if self.state is not None:
            self.state.pending = ([r.id for r in active], records)
        n_groups = len(results)
        metrics.update({f"rubric/{k}": float(v) for k, v in counts.items()})
        metrics["rubric/active"] = float(len(active))
        metrics.update({f"induction/{k}": float(v) for k, v in reasons.items()})
        metrics.update(_tally_metrics("judge", judge_tally, n_groups))
        metrics.update(_tally_metrics("induction", induce_tally, n_groups))
        metrics["llm/calls_per_group"] = (judge_tally.calls + induce_tally.calls) / max(n_groups, 1)
        metrics.update(homogeneity_metrics(homogeneity))
        return RewardOutput(total, metrics)


# ---------------------------------------------------------------- RaR-style baseline


class RarState:
    """The static checklist of each question seen so far (question id -> items), kept across checkpoints."""

    def __init__(self) -> None:
        self.checklists: dict[str, list[str]] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"checklists": dict(self.checklists)}

    def load_state_dict(self, state: dict[str, Any] | None, files_dir: Path | None = None) -> None:
        self.checklists = dict((state or {}).get("checklists", {}))

    def write_files(self, folder: Path) -> None:
        write_json(Path(folder) / "rar_checklists.json", self.checklists)

    def rank_share(self) -> dict[str, list[str]]:
        return self.checklists

    def merge_ranks(self, parts: list[dict[str, list[str]]]) -> None:
        """Every rank's checklists on every rank: a question another rank wrote one for is not written again."""
        for part in parts:
            self.checklists.update(part)


@dataclass
class RarReward:
    settings: ArborParams
    writer: ChatModel
    judge: ChatModel
    state: RarState
    outcome: OutcomeReward = field(default_factory=OutcomeReward)

    async def _group(self, members: list[int], episodes: list[Episode], writer_tally: Tally,
                     judge_tally: Tally) -> list[float | None] | None:
        s = self.settings
        question = episodes[members[0]].prompt
        items = self.state.checklists.get(question.id)
        if items is None:
            items = await write_checklist(self.writer, question, s.rar_min_items, s.rar_max_items, writer_tally,
                                          max_tokens=s.writer_max_tokens)
            if items is None:
                return None
            self.state.checklists[question.id] = items
        texts = [trajectory_text(episodes[i].info["trajectory"], s.observation_chars) for i in members]
        return list(await asyncio.gather(*(rate(self.judge, question.question, t, items, judge_tally,
                                                s.judge_max_tokens) for t in texts)))

    async def __call__(self, episodes: list[Episode], ctx: StepContext) -> RewardOutput:
        s = self.settings
        o = _outcomes(episodes, ctx, self.outcome)
        writer_tally, judge_tally = Tally(), Tally()
        members = list(o.groups.values())
        ratings = await asyncio.gather(*(self._group(m, episodes, writer_tally, judge_tally) for m in members))
        total, homogeneity, unscored, no_checklist = list(o.base), [], 0, 0
        for m, r in zip(members, ratings, strict=True):
            f1, valid, base = _pick(o.f1, m), _pick(o.valid, m), _pick(o.base, m)
            no_checklist += r is None
            shaped = shape_group(base, valid, [] if r is None else [r], lam=s.shaping_lambda, alpha=1.0, delta_v=0.0)
            unscored += shaped.unscored
            for i, value in zip(m, shaped.total, strict=True):
                total[i] = value
            homogeneity.append((f1, valid, base, shaped.total))
        metrics = dict(o.metrics)
        metrics.update({"rubric/unscored_trajectories": float(unscored), "rubric/no_checklist": float(no_checklist)})
        metrics.update(_tally_metrics("judge", judge_tally, len(members)))
        metrics.update(_tally_metrics("checklist", writer_tally, len(members)))
        metrics.update(homogeneity_metrics(homogeneity))
        return RewardOutput(total, metrics)


# ---------------------------------------------------------------- variants


def _settings(ctx: VariantContext) -> ArborParams:
    s = ctx.params.arbor
    if s.rar_min_items > s.rar_max_items:
        raise ValueError(f"arbor.rar_min_items ({s.rar_min_items}) exceeds arbor.rar_max_items ({s.rar_max_items})")
    return s


def _pairwise_judge(ctx: VariantContext, s: ArborParams) -> ChatModel:
    """The judge role's model, scored as ``arbor.judge_scoring`` says when it is set (a role's model is built
    afresh for each caller, so the inducer on the same role keeps the role's own scoring)."""
    return scored_as(ctx.roles(s.judge_role), s.judge_scoring)


@VARIANTS.register("arbor")
def build_arbor(ctx: VariantContext) -> VariantParts:
    s = _settings(ctx)
    memory = RubricMemory(s, embed=lazy_embedder(ctx, s.embedder))
    state = ArborState(memory, ctx.roles(s.consolidator_role), s, snapshot_dir=Path(ctx.out_dir) / "memory")
    reward = ArborReward(s, judge=_pairwise_judge(ctx, s), inducer=ctx.roles(s.inducer_role), seed=ctx.params.seed,
                         state=state, outcome=outcome_reward(ctx.params.grpo))
    return VariantParts(reward_fn=reward, method=state)


@VARIANTS.register("arbor_no_memory")
def build_arbor_no_memory(ctx: VariantContext) -> VariantParts:
    s = _settings(ctx)
    return VariantParts(reward_fn=ArborReward(s, judge=_pairwise_judge(ctx, s), inducer=ctx.roles(s.inducer_role),
                                              seed=ctx.params.seed, outcome=outcome_reward(ctx.params.grpo)))


@VARIANTS.register("rar")
def build_rar(ctx: VariantContext) -> VariantParts:
    s = _settings(ctx)
    state = RarState()
    return VariantParts(reward_fn=RarReward(s, writer=ctx.roles(s.inducer_role), judge=ctx.roles(s.judge_role),
                                            state=state, outcome=outcome_reward(ctx.params.grpo)), method=state)
