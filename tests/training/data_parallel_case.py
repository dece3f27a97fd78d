"""One data-parallel training case of tests/training/test_data_parallel.py: run as a single process, or as N ranks
under ``torchrun`` (each rank reads its rank from the launcher's environment, gloo on the CPU).

    python -m tests.training.data_parallel_case OUT {grpo,grpo_arbor,grpo_arco,grpo_zero2,grpo_zero3,sft,sft_zero2,sft_zero3} STEPS [CKPT_DIR [KILL_AT]]
    python -m torch.distributed.run --nproc_per_node 2 -m tests.training.data_parallel_case OUT grpo 3

``RUBRICFLOW_DP_DEVICE=cuda`` trains on each rank's GPU (NCCL). Trains a tiny random Qwen2 with LoRA (``*_zero2``/``sft_zero3``: every weight, under DeepSpeed ZeRO-2/3) for STEPS steps on a
fixed total batch: GRPO over 4 prompts x 4 episodes whose responses are a function of the prompt and the episode's
index (no sampling, so every process count sees the same episodes), scored by a reward that records each episode
it scores in ``OUT.calls.<rank>.json``; SFT over 8 examples, 4 a step. Rank 0 alone writes ``OUT`` (the trained
weights, safetensors) and ``OUT.json`` (each step's metrics, the ranks and whether it resumed); ``on_metrics``
appends to ``OUT.metrics.jsonl``. With CKPT_DIR it resumes from there when it can and checkpoints every step;
with KILL_AT, rank 1 (or the only rank) SIGKILLs itself in the middle of step KILL_AT, after its rollout.
``grpo_arbor`` trains with ARBOR's rubric memory as the method: the reward leaves each group's record (one
draft rubric, scored as the episodes are) in it, the memory admits the drafts in its step hook, and each rank writes
its method state in ``OUT.method.<rank>.json`` and how often the hook ran in ``OUT.hooks.<rank>.json``.
``grpo_arco`` trains ARCO as tests/arco/test_arco_trainer.py does (ReAct episodes replayed by a scripted engine
over 2 questions, mu a tiny Qwen2 with a scripted criteria writer, a scripted teacher; warm-up at step 1, the
policy on mu's step rewards and mu's update at step 3): each rank writes mu's tensors to ``OUT.mu.<rank>.safetensors``
and its teacher calls to ``OUT.teacher.<rank>.json``; ``OUT.calls.<rank>.json`` holds the episodes its reward scored.
``grpo_zero3`` is the README's full fine-tuning recipe: ZeRO-3 with every parameter sharded (persistence threshold
0), each episode's response generated greedily by the policy itself (transformers' generate, its length the
episode's own), two PPO epochs (so the old log-probs are a pass of their own), 3 prompts on 2 ranks (rank 0 runs
twice as many generations and log-prob passes as rank 1).
GRPO then keys a run folder ``OUT.run`` (components.run_files.keyed_folder) and plays a greedy dev evaluation of 5
questions there (components.policy_run.dev_evaluation), each rank its share (recorded in ``OUT.dev.<rank>.json``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from components.training.distributed import current_ranks
from components.training.engines.rollout import HFRolloutEngine, RolloutSegment, SamplingParams
from components.training.grpo.episodes import Episode
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import LoRASettings, build_policy
from components.training.params import DeepSpeedParams, GRPOParams, SFTParams
from components.training.sft.examples import SFTExample
from components.training.sft.trainer import SFTTrainer
from components.training.tiny import CharTokenizer, tiny_qwen2

TOK = CharTokenizer("abcdefghijklmn")
PROMPTS = ["abc", "bcd", "cde", "def", "efg", "fgh", "ghi", "hij"]
EXAMPLES = [SFTExample([2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 1, 1]), SFTExample([3, 4, 5, 6], [0, 1, 1, 1]),
            SFTExample([7, 8, 9, 2, 3], [0, 0, 0, 1, 1]), SFTExample([4, 4, 5, 5, 6, 6, 7], [0, 1, 1, 1, 1, 1, 1]),
            SFTExample([9, 8, 7, 6], [0, 1, 1, 1]), SFTExample([2, 2, 3, 3, 4], [0, 0, 1, 1, 1]),
            SFTExample([5, 9, 13, 6, 10], [0, 1, 1, 1, 1]), SFTExample([11, 12, 13, 2], [0, 0, 1, 1])]


class _Engine:
    pad_token_id = 0

    def update_weights(self, policy, step):
        pass


def _rollout(kill_at: int | None, trainer_box: list):
    def rollout(engine, prompts, group_size, sampling):
        trainer = trainer_box[0]
        if kill_at is not None and trainer.step_count + 1 == kill_at and trainer.ranks.rank == trainer.ranks.world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: after the step began, before its update
        episodes = []
        for p in prompts:
            ids = TOK.encode(p)
            for k in range(group_size):
                response = [2 + (ids[0] * 3 + k * 5 + j) % 14 for j in range(2 + k % 3)]
                episodes.append(Episode(prompt=p, group=len(episodes) // group_size,
                                        rows=[[RolloutSegment(ids, False), RolloutSegment(response, True)]],
                                        text=f"{p}/{k}"))
        return episodes
    return rollout


def _generated_rollout(model):
    """Each episode's response is the policy's own greedy continuation of the prompt plus the episode's index
    token, 2-4 tokens long: a function of the weights, and every rank runs as many forward passes as its share."""
    engine = HFRolloutEngine(model, pad_token_id=0, max_batch_size=1)

    def rollout(_engine, prompts, group_size, sampling):
        episodes = []
        for p in prompts:
            for k in range(group_size):
                ids = TOK.encode(p) + [2 + k]
                (gen,) = engine.generate([ids], SamplingParams(max_new_tokens=2 + k % 3, temperature=0.0))
                episodes.append(Episode(prompt=p, group=len(episodes) // group_size,
                                        rows=[[RolloutSegment(ids, False), RolloutSegment(gen.token_ids, True)]],
                                        text=f"{p}/{k}"))
        return episodes
    return rollout


def _reward(calls: list):
    def reward(episodes, ctx):
        calls.extend([ctx.step, e.text] for e in episodes)
        return [sum(t in (6, 7, 8) for t in e.response_ids) / len(e.response_ids) for e in episodes]
    return reward


def _arbor():
    """ARBOR's memory as the method (no consolidation in 3 steps, every draft admitted), counting its hook's runs."""
    from components.methods.arbor.memory import GroupRecord, RubricMemory, RubricText
    from components.methods.arbor.params import ArborParams
    from components.methods.arbor.variants import ArborState

    class Counted(ArborState):
        hook_calls = 0

        async def on_step_end(self, trainer, ctx, episodes, scores):
            self.hook_calls += 1
            return await super().on_step_end(trainer, ctx, episodes, scores)

    settings = ArborParams(delta_v=0.0, k_consol=1000)
    state = Counted(RubricMemory(settings), consolidator=None, settings=settings)

    def observe(reward):
        def scored(episodes, ctx):
            scores = reward(episodes, ctx)
            groups: dict[int, list[int]] = {}
            for i, e in enumerate(episodes):
                groups.setdefault(e.group, []).append(i)
            state.pending = ([], [GroupRecord(episodes[m[0]].prompt, episodes[m[0]].prompt, [scores[i] for i in m], {},
                                              [(RubricText(title=f"g{g}", description=f"step {ctx.step}",
                                                           counter_description="not"), [10 * scores[i] for i in m])])
                                  for g, m in groups.items()])
            return scores
        return scored
    return state, observe


def _arco(ranks, config: GRPOParams, root: Path, log, calls: list, teacher_calls: list) -> GRPOTrainer:
    """ARCO's trainer over two questions (one a rank on 2 ranks), its pieces those of tests/arco/helpers.py."""
    from components.agents.params import AgentParams
    from components.agents.react import ReActAgent
    from components.methods.arco.params import ArcoParams
    from components.methods.arco.rubric_model import RubricModel
    from components.methods.arco.variants import ArcoReward, ArcoState
    from components.training.grpo.agent_rollout import make_agent_rollout
    from tests.arco import helpers

    lora = LoRASettings(r=4, alpha=8)
    settings = ArcoParams(k=3, warmup_steps=1, warmup_epochs=1, update_every=2, micro_batch=2, head_width=8, lr=1e-2,
                          kl_coef=0.1)

    def mu():
        return RubricModel(tiny_qwen2(helpers.TOK.vocab_size, max_positions=2048, seed=3), helpers.TOK, lora=lora,
                           head_width=8, k=3, engine=helpers.MuWriter(), render=helpers.render, seed=5)

    teacher = helpers.teacher()
    teacher.requests = teacher_calls  # each request it answers
    state = ArcoState(settings, mu, teacher, sparse_steps=2)
    policy = build_policy(tiny_qwen2(helpers.TOK.vocab_size, max_positions=2048, seed=0), lora=lora)
    agent = AgentParams(history_format="scratchpad", max_turns=4, max_search_calls=3, max_tokens=64)
    rollout = make_agent_rollout(lambda p: ReActAgent(p, helpers.Tools(), agent, system_prompt="Answer by searching."),
                                 helpers.TOK, render=helpers.render)
    scored = ArcoReward(state)

    def reward(episodes, ctx):
        calls.extend([ctx.step, f"{e.prompt.id}/g{e.group}"] for e in episodes)
        return scored(episodes, ctx)

    questions = [helpers.Q, helpers.Q.model_copy(update={"id": "wq-2"})]
    return GRPOTrainer(policy, helpers.PolicyEngine(), reward, questions, config, rollout_fn=rollout,
                       advantage_fn=state.advantages, method=state, checkpoint_dir=root, pad_token_id=0,
                       on_metrics=log, ranks=ranks)


def _dev(out: str, ranks) -> None:
    from components.policy_run import dev_evaluation
    from components.run_files import keyed_folder
    from components.schemas import Question, Trajectory

    folder = Path(out + ".run")
    keyed_folder(folder, {"case": "data_parallel"}, ranks=ranks)
    questions = [Question(id=f"q{i}", question=f"Q{i}?", answers=["x"], source="world") for i in range(5)]
    seen: list[str] = []

    def rollout(engine, qs, group_size, sampling):
        seen.extend(q.id for q in qs)
        return [Episode(prompt=q, group=i, rows=[], info={"trajectory": Trajectory(
            question_id=q.id, question=q.question, steps=[], final_answer="x" if int(q.id[1:]) % 2 else "y",
            finish_reason="answer", policy="p")}) for i, q in enumerate(qs)]

    metrics = dev_evaluation(rollout, _Engine(), questions, 8, folder / "dev.jsonl", ranks=ranks)
    Path(f"{out}.dev.{ranks.rank}.json").write_text(json.dumps({"seen": seen, "metrics": metrics}))


def main(out: str, kind: str, steps: str, ckpt: str | None = None, kill_at: str | None = None) -> None:
    torch.set_num_threads(1)
    ranks = current_ranks()
    torch.manual_seed(0)
    zero = None
    if "_zero" in kind:  # grpo_zero3: every parameter sharded, so each forward pass gathers
        zero = DeepSpeedParams(zero_stage=int(kind[-1]), param_persistence_threshold=0 if kind == "grpo_zero3" else 100_000)
    lora = None if zero is not None else LoRASettings(r=4, alpha=8)
    device = os.environ.get("RUBRICFLOW_DP_DEVICE", "cpu")  # scripts/gpu_tests.sh: cuda, one GPU a rank (NCCL)
    if device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0).to(device), lora=lora)

    def log(step, metrics):
        with open(out + ".metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "rank": ranks.rank, "loss": metrics.get("loss")}) + "\n")

    calls: list = []
    teacher_calls: list = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(ckpt or tmp)
        if kind.startswith("grpo"):
            full = zero is not None  # full fine-tuning: no LoRA-off reference for the KL term, a smaller step
            # full: 3 prompts, so rank 1's share (1 prompt: 2 micro-batches) pads to rank 0's 3 with empty backwards
            config = GRPOParams(lr=1e-2 if full else 5e-2, group_size=4, prompts_per_step=3 if full else 4,
                                micro_batch_size=3, ppo_epochs=2 if kind == "grpo_zero3" else 1,
                                kl_coef=0.0 if full else 0.01,
                                max_grad_norm=1.0, steps=int(steps), checkpoint_every=1 if ckpt else 0)
            box: list = []
            method, reward = None, _reward(calls)
            if kind == "grpo_arbor":
                method, observe = _arbor()
                reward = observe(reward)
            rollout = _rollout(None if kill_at is None else int(kill_at), box)
            if kind == "grpo_zero3":
                rollout = _generated_rollout(policy.model)
            if kind == "grpo_arco":
                config = config.model_copy(update={"group_size": 2, "prompts_per_step": 2, "shuffle": False,
                                                   "lr": 1e-3, "kl_coef": 0.0})
                trainer = _arco(ranks, config, root, log, calls, teacher_calls)
            else:
                trainer = GRPOTrainer(policy, _Engine(), reward, PROMPTS, config, seed=0, on_metrics=log,
                                      rollout_fn=rollout, checkpoint_dir=root, zero=zero, ranks=ranks, method=method)
            box.append(trainer)
        else:
            config = SFTParams(lr=2e-2, batch_size=4, micro_batch_size=1 if zero else 3, max_grad_norm=0.5,
                               checkpoint_every=1 if ckpt else 0, epochs=10)
            trainer = SFTTrainer(policy, EXAMPLES, config, pad_token_id=0, seed=0, checkpoint_dir=root,
                                 on_metrics=log, zero=zero, ranks=ranks)
            if kill_at is not None:
                step = trainer.step

                def killing_step():
                    if trainer.step_count + 1 == int(kill_at) and ranks.rank == ranks.world_size - 1:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return step()
                trainer.step = killing_step
        resumed = trainer.resume() if ckpt else False
        metrics = [trainer.step() for _ in range(trainer.step_count, int(steps))]
        if zero is not None and zero.zero_stage == 3:  # gathered from every rank's shards
            weights = trainer.stepper.full_state_dict() or {}  # (rank 0's; None elsewhere)
        else:
            weights = {n: p for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
        weights = {n: p.detach().float().cpu().contiguous().clone() for n, p in weights.items()}
    Path(f"{out}.calls.{ranks.rank}.json").write_text(json.dumps(calls))
    if kind == "grpo_arco":
        save_file({k: v.contiguous() for k, v in trainer.method.mu.state_tensors().items()}, f"{out}.mu.{ranks.rank}.safetensors")
        Path(f"{out}.teacher.{ranks.rank}.json").write_text(json.dumps([m[-1].content for m, _ in teacher_calls]))
    if kind == "grpo_arbor":
        Path(f"{out}.method.{ranks.rank}.json").write_text(json.dumps(trainer.method.state_dict()))
        Path(f"{out}.hooks.{ranks.rank}.json").write_text(json.dumps(trainer.method.hook_calls))
    if kind.startswith("grpo"):
        _dev(out, ranks)
    if ranks.main:
        save_file(weights, out)
        Path(out + ".json").write_text(json.dumps({
            "world_size": ranks.world_size, "resumed": resumed, "optimizer": type(trainer.optimizer).__name__,
            "metrics": [{k: float(v) for k, v in m.items() if not k.startswith(("time/", "memory/"))}
                        for m in metrics]}))


if __name__ == "__main__":
    main(*sys.argv[1:])
