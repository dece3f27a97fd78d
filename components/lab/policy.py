"""The nano policy trained and measured through the project's own trainers: SFT from scratch on compact oracle
episodes (:class:`components.training.sft.trainer.SFTTrainer`), greedy evaluation through the rollout engine
the trainers use (:class:`components.training.engines.rollout.HFRolloutEngine`, batched ``generate`` with a KV
cache), and GRPO with the exact outcome reward (:class:`components.training.grpo.trainer.GRPOTrainer` with the
agent rollout: ``grpo.group_size`` attempts per question, every episode of a step decoded in one batch).

    data = sft_corpus(params)                        # rows of the compact oracle episodes, other worlds
    nano = train_nano(params, data, seed=0)          # fitted tokenizer, random init, SFT; same seed, same weights
    nano.save("outputs/lab/sft")
    em = evaluate(nano, lab, lab.splits["test"], params.agent)["em"]
    em = evaluate(nano, lab, lab.splits["test"], params.agent, protocol=lab_protocols(params.methods)["scaffold"])["em"]
    curve = grpo_run(params, NanoPolicy.load("outputs/lab/sft"), lab, seed=0)

``torch.set_num_threads`` is the caller's (``run.torch_threads``; the lab runs on one thread).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from components.agents.params import AgentParams, MethodParams
from components.lab.nano import fit_tokenizer, load_nano, load_tokenizer, nano_qwen2
from components.lab.params import LabParams
from components.lab.scaffold import scaffold_protocol
from components.lab.world import (
    REACT,
    LabWorld,
    Protocol,
    build_lab_world,
    compact_episodes,
    sft_rows,
    unread_questions,
)
from components.params import Params
from components.rewards.outcome import outcome_reward
from components.schemas import Question
from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.grpo.agent_rollout import make_agent_rollout
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import build_policy
from components.training.sft.examples import SFTExample, build_sft_example
from components.training.sft.trainer import SFTTrainer

__all__ = ["NanoPolicy", "SFTCorpus", "answer_sources", "closed_book", "evaluate", "greedy_trajectories",
           "grpo_questions", "grpo_run", "grpo_source", "lab_protocols", "lab_seed", "scores", "sft_corpus",
           "sft_questions", "train_nano"]


def lab_seed(params: Params) -> int:
    return params.seed if params.lab.world_seed is None else params.lab.world_seed


@dataclass
class NanoPolicy:
    model: torch.nn.Module
    tokenizer: object
    info: dict = field(default_factory=dict)

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> NanoPolicy:
        return cls(load_nano(folder), load_tokenizer(folder))

    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


@dataclass
class SFTCorpus:
    rows: list[list[tuple[str, bool]]]
    episodes: int
    counts: Counter
    documents: list[str] = field(default_factory=list)  # the paragraphs of every world read: the tokenizer fits them too
    tags: tuple[str, ...] = ()  # the protocols' tags, each kept as one token


def sft_questions(settings: LabParams, lab: LabWorld) -> list[Question]:
    """The lab world's train questions the SFT reads (``lab.sft_own_questions``; all of them when None)."""
    return lab.splits["train"][:settings.sft_own_questions]


def grpo_questions(settings: LabParams, lab: LabWorld) -> list[Question]:
    """The train questions GRPO trains on in the lab world: those after the SFT's share when
    ``lab.sft_own_questions`` holds some back, else the whole split."""
    n = settings.sft_own_questions
    held_out = lab.splits["train"][n:] if settings.sft_own_world and n is not None else []
    return held_out or lab.splits["train"]


def grpo_source(params: Params, lab: LabWorld) -> tuple[list[Question], Any]:
    """GRPO's questions and the toolbox their episodes search: :func:`grpo_questions` in the lab world, or with
    ``lab.grpo_worlds`` the questions of the first that many SFT worlds (seeds lab seed + 1..) that the SFT did not
    read, each served its own world's tools."""
    lp = params.lab
    if not lp.grpo_worlds:
        return grpo_questions(lp, lab), lab.toolbox
    if lp.grpo_worlds > lp.sft_worlds:
        raise ValueError(f"lab.grpo_worlds ({lp.grpo_worlds}) draws from the SFT's worlds: at most lab.sft_worlds "
                         f"({lp.sft_worlds})")
    worlds = [build_lab_world(params, lab.seed + 1 + i, lp.grpo_questions_per_world) for i in range(lp.grpo_worlds)]
    return unread_questions(worlds, params.world, lp.sft_questions_per_world)


def lab_protocols(methods: dict[str, MethodParams]) -> dict[str, Protocol]:
    """The protocols the nano can be trained in, by name: ReAct under the lab prompt, RubricEM's scaffold under the
    lab's scaffold prompt (``methods.sft_scaffold.options.system_prompt``, what its variants run under)."""
    return {"react": REACT, "scaffold": scaffold_protocol(methods["sft_scaffold"].options["system_prompt"])}


def sft_corpus(params: Params) -> SFTCorpus:
    """Compact oracle episodes of ``lab.sft_worlds`` other worlds (seeds lab seed + 1 ..) and, with
    ``lab.sft_own_world``, of the lab world's train split, as chat-history SFT rows, in each of ``lab.sft_protocols``
    (the same questions' episodes once per protocol, protocol after protocol, in that order); plus the opening turn
    alone of each question in ``lab.sft_opening_worlds`` further worlds (ReAct's); and ``lab.sft_document_rows``
    copies of every world's paragraphs, each a row trained whole."""
    lab, seed = params.lab, lab_seed(params)
    protocols = [lab_protocols(params.methods)[name] for name in lab.sft_protocols]
    rows, episodes, counts, documents = [], 0, Counter(), []
    sources = [(build_lab_world(params, seed + i, lab.sft_questions_per_world), None, False)
               for i in range(1, lab.sft_worlds + 1)]
    if lab.sft_own_world:
        own = build_lab_world(params, seed)
        sources.append((own, sft_questions(lab, own), False))
    else:  # the lab world's names are fitted to, never its questions' episodes
        documents += [d.text for d in build_lab_world(params, seed).world.documents]
    sources += [(build_lab_world(params, seed + i, lab.sft_questions_per_world), None, True)
                for i in range(101, 101 + lab.sft_opening_worlds)]
    for world, _, _ in sources:
        documents += [d.text for d in world.world.documents]
    for protocol in protocols:
        for world, questions, opening_only in sources:
            if opening_only and protocol is not REACT:
                continue
            found, skipped = compact_episodes(world, world.questions if questions is None else questions,
                                              params.agent, protocol)
            counts.update(skipped if protocol is REACT else {f"{protocol.name}_{k}": v for k, v in skipped.items()})
            if opening_only:
                rows += [row[:2] for row in sft_rows(found, params.agent)]  # the prompt and the first reply
                counts["opening_rows"] += len(found)
            else:
                rows += sft_rows(found, params.agent, protocol)
                episodes += len(found)
                if protocol is not REACT:
                    counts[f"{protocol.name}_rows"] += len(found)
    if lab.sft_document_rows:
        rows += [[(text, True)] for text in documents] * lab.sft_document_rows
        counts["document_rows"] = len(documents) * lab.sft_document_rows
    return SFTCorpus(rows, episodes, counts, documents, tuple(t for p in protocols for t in p.tags))


def nano_examples(corpus: SFTCorpus, vocab_size: int, max_length: int | None) -> tuple[Any, list[SFTExample]]:
    """The nano's tokenizer of ``vocab_size``, fitted to ``corpus`` (its rows and the worlds' paragraphs, so a name
    the policy reads is a token or two), and the corpus's rows as SFT examples in it, cut at ``max_length``."""
    tok = fit_tokenizer(["".join(text for text, _ in row) for row in corpus.rows] + corpus.documents,
                        vocab_size, corpus.tags)
    return tok, [build_sft_example(row, tok, max_length=max_length) for row in corpus.rows]


def train_nano(params: Params, corpus: SFTCorpus, *, seed: int = 0,
               on_metrics: Callable[[int, dict], None] | None = None, progress: str | None = None) -> NanoPolicy:
    """Fit the tokenizer on ``corpus`` (its rows and the worlds' paragraphs, so a name the policy reads is a token or
    two), build the nano Qwen2 (random init from ``seed``) and train it from scratch
    with the SFT trainer and ``params.sft`` (full fine-tuning: every weight is trained)."""
    tok, examples = nano_examples(corpus, params.lab.nano.vocab_size, params.sft.max_length)
    model = nano_qwen2(params.lab.nano, tok, seed=seed)
    policy = build_policy(model, lora=None)
    trainer = SFTTrainer(policy, examples, params.sft, pad_token_id=tok.pad_token_id, seed=seed,
                         on_metrics=on_metrics)
    started = time.perf_counter()
    history = trainer.train(progress=progress)
    tokens = [len(e.input_ids) for e in examples]
    info = {"sft_s": time.perf_counter() - started, "sft_steps": trainer.step_count, "rows": len(examples),
            "episodes": corpus.episodes, "row_tokens_mean": sum(tokens) / len(tokens), "row_tokens_max": max(tokens),
            "final_loss": history[-1]["loss"], "vocab": len(tok)}
    model.eval()
    return NanoPolicy(model, tok, info)


def _rollout(nano_tokenizer, toolbox, settings: AgentParams, protocol: Protocol = REACT):
    return make_agent_rollout(lambda policy: protocol.agent(policy, toolbox, settings), nano_tokenizer)


def greedy_trajectories(nano: NanoPolicy, lab: LabWorld, questions: list[Question], settings: AgentParams,
                        engine: HFRolloutEngine | None = None, protocol: Protocol = REACT) -> list:
    """One greedy episode of every question under ``protocol``'s agent, decoded together."""
    engine = engine or HFRolloutEngine(nano.model, nano.tokenizer)
    episodes = _rollout(nano.tokenizer, lab.toolbox, settings, protocol)(
        engine, questions, 1, SamplingParams(max_new_tokens=settings.max_tokens, temperature=0.0, logprobs=False))
    return [e.info["trajectory"] for e in episodes]


def closed_book(questions: list[Question]) -> list[Question]:
    """The questions with each one's retrieval scope (``paragraph_ids``) taken from the next question's, so under
    ``retrieval.scope: question`` a search finds only paragraphs about something else: what is still answered right
    is answered from the weights."""
    scopes = [q.metadata["paragraph_ids"] for q in questions]
    return [q.model_copy(update={"metadata": {**q.metadata, "paragraph_ids": scopes[(i + 1) % len(questions)]}})
            for i, q in enumerate(questions)]


def answer_sources(trajectories: list, questions: list[Question]) -> Counter:
    """Each episode as right or wrong and as having seen a gold answer in its observations or not
    (``right_seen``, ``right_unseen``, ``wrong_seen``, ``wrong_unseen``): a wrong answer seen is a reading failure,
    one never seen a search failure, a right one never seen an answer from the weights."""
    from components.evaluation.metrics import exact_match, normalize_answer

    out = Counter()
    for t, q in zip(trajectories, questions, strict=True):
        shown = normalize_answer(" ".join(s.observation for s in t.steps))
        seen = any(normalize_answer(a) in shown for a in q.answers)
        out[f"{'right' if exact_match(t.final_answer, q.answers) else 'wrong'}_{'seen' if seen else 'unseen'}"] += 1
    return out


def evaluate(nano: NanoPolicy, lab: LabWorld, questions: list[Question], settings: AgentParams,
             engine: HFRolloutEngine | None = None, protocol: Protocol = REACT) -> dict[str, float]:
    """Greedy episodes of every question under ``protocol``'s agent, decoded together, as :func:`scores`."""
    return scores(greedy_trajectories(nano, lab, questions, settings, engine, protocol), questions)


def scores(trajectories: list, questions: list[Question]) -> dict[str, float]:
    """EM, F1, answered rate and mean turns of one episode per question."""
    from components.evaluation.metrics import exact_match, f1_score

    n = len(trajectories)
    return {"em": sum(exact_match(t.final_answer, q.answers) for t, q in zip(trajectories, questions)) / n,
            "f1": sum(f1_score(t.final_answer, q.answers) for t, q in zip(trajectories, questions)) / n,
            "answered": sum(t.finish_reason == "answer" for t in trajectories) / n,
            "turns": sum(len(t.steps) for t in trajectories) / n, "n": float(n)}


def grpo_run(params: Params, start: NanoPolicy, lab: LabWorld, *, seed: int, steps: int | None = None,
             eval_every: int | None = None, on_metrics: Callable[[int, dict], None] | None = None,
             reward=None, on_point: Callable[[list[dict]], None] | None = None,
             source: tuple[list[Question], Any] | None = None) -> list[dict[str, float]]:
    """GRPO of ``start`` (full fine-tuning, KL to ``start`` as ``grpo.kl_coef`` says) on :func:`grpo_source`'s
    questions (``source``: those questions and their toolbox, already built) with the exact-match outcome reward (0
    for a wrong answer, ``grpo.format_penalty`` for a missing one; ``reward`` replaces it), ``steps`` steps
    (``lab.grpo_steps``);
    greedy dev EM every ``eval_every`` steps and at step 0. One dict per evaluation point: step, dev EM/F1/answered,
    the mean training reward since the last point, and the seconds spent in rollout, reward and update."""
    lab_params = params.lab
    steps, eval_every = steps or lab_params.grpo_steps, eval_every or lab_params.eval_every
    split = lab.splits
    torch.manual_seed(seed)
    policy = build_policy(start.model, lora=None)
    engine = HFRolloutEngine(policy.model, start.tokenizer)
    curve, since, timing, started = [], [], Counter(), time.perf_counter()

    def record(step: int, metrics: dict) -> None:  # the trainer hands its wall-clock figures to on_metrics only
        since.append(metrics.get("reward/mean", float("nan")))
        for key in ("rollout", "reward", "update"):
            timing[key] += metrics.get(f"time/{key}", 0.0)
        if on_metrics is not None:
            on_metrics(step, metrics)

    reward = reward or replace(outcome_reward(params.grpo), metric="em")
    questions, toolbox = source or grpo_source(params, lab)
    trainer = GRPOTrainer(policy, engine, reward, questions,
                          params.grpo, rollout_fn=_rollout(start.tokenizer, toolbox, params.agent),
                          pad_token_id=start.tokenizer.pad_token_id, seed=seed, on_metrics=record)
    nano = NanoPolicy(policy.model, start.tokenizer)

    def point(step: int) -> None:
        policy.model.eval()
        dev = evaluate(nano, lab, split["dev"], params.agent, engine)
        curve.append({"step": float(step), **{f"dev_{k}": v for k, v in dev.items()},
                      "reward": sum(since) / len(since) if since else float("nan"),
                      "wall_s": time.perf_counter() - started, **{f"time/{k}": v for k, v in timing.items()}})
        since.clear()
        if on_point is not None:  # the curve so far, e.g. to keep it on disk while the run goes on
            on_point(curve)

    point(0)
    while trainer.step_count < steps:
        trainer.step()
        if trainer.step_count % eval_every == 0 or trainer.step_count == steps:
            point(trainer.step_count)
    trainer.finish()
    return curve
