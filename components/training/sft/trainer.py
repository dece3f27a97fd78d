"""The SFT loop: masked cross-entropy over (prompt | reply | observation | reply ...) rows, resumable through the
same atomic checkpoints as GRPO, with the same speed options (activation recomputation for long micro-batches,
shared-prefix packs) and data-parallel ranks (:class:`SFTTrainer`). The configuration is ``params.sft``
(:class:`components.training.params.SFTParams`): the same names in the YAML file and in the code.

    trainer = SFTTrainer(policy, examples, params.sft, pad_token_id=tok.pad_token_id, seed=params.seed,
                         checkpoint_dir="outputs/sft/ckpt", on_metrics=log)
    trainer.resume()
    history = trainer.train()        # one dict per optimizer step: loss, tokens, grad_norm, lr
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from components.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from components.training.distributed import Ranks, current_ranks
from components.training.losses import aggregate
from components.training.model import Policy, kept_if_short
from components.training.params import DeepSpeedParams, SFTParams
from components.training.prompt_order import PromptSampler
from components.training.sft.examples import SFTExample, collate_sft
from components.training.speed.prefix_pack import pack_rows, packed_logprobs, takes_packs
from components.training.stepper import make_stepper

__all__ = ["SFTTrainer", "lr_scheduler", "warmup_steps"]


def warmup_steps(config: SFTParams, total_steps: int) -> int:
    """Optimizer steps of the warm-up: ``warmup_ratio`` of ``total_steps`` rounded up, as transformers'
    ``TrainingArguments.get_warmup_steps`` does (the papers' SFT ran in LLaMA-Factory, on that trainer), but
    without float noise rounding up a whole step (0.1 x 30 is 3.0000000000000004: 3 steps, not 4); or
    ``warmup_steps`` when no ratio is given."""
    if config.warmup_ratio:
        return math.ceil(round(config.warmup_ratio * total_steps, 9))
    return config.warmup_steps


def lr_scheduler(optimizer: torch.optim.Optimizer, config: SFTParams,
                 total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The LR schedule of an SFT run of ``total_steps`` optimizer steps, stepped once after each of them.

    ``constant``: linear warm-up from ``lr / w`` at the first step to ``lr`` (the schedule rubricflow has always
    had), then ``lr``. ``cosine``: transformers' ``get_cosine_schedule_with_warmup``: 0 at the first step,
    ``lr * s / w`` during the warm-up, then ``lr * (1 + cos(pi * (s - w) / (total_steps - w))) / 2``, which
    reaches 0 one step after the last. Both are ``LambdaLR``s, so a checkpoint restores their position.
    """
    w = warmup_steps(config, total_steps)
    if config.lr_schedule == "cosine":
        from transformers import get_cosine_schedule_with_warmup

        return get_cosine_schedule_with_warmup(optimizer, num_warmup_steps=w, num_training_steps=total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / w if s < w else 1.0)


class SFTTrainer:
    """One optimizer step takes ``batch_size`` rows in ``micro_batch_size`` chunks, each chunk's loss divided by the
    batch's token or sequence count so the sum is the batch loss; rows are shuffled with a seed each epoch; the LR
    warms up linearly over ``warmup_steps`` (or ``warmup_ratio`` of the run's steps), then stays constant or, with
    ``lr_schedule: cosine``, decays along a half cosine to 0 (ARBOR B.2, RubricEM F.1.1: cosine after a 10%
    warm-up). With ``gradient_checkpointing`` micro-batches under ``checkpoint_min_tokens`` padded tokens keep
    their activations (:func:`components.training.model.kept_if_short`); with ``prefix_packing`` a micro-batch runs
    as one shared-prefix pack (:mod:`components.training.speed.prefix_pack`): no padding, a shared history
    computed once, the same loss to float rounding. On N data-parallel ranks every rank draws the same batch
    and trains its contiguous share, each loss over the whole batch's counts and the gradients summed (DDP's
    all-reduce; ZeRO's under ``zero``), so a step equals the single-process one to float rounding; rank 0
    alone calls ``on_metrics`` and every rank writes its own optimizer and RNG files."""

    def __init__(
        self,
        policy: Policy,
        examples: Sequence[SFTExample],
        config: SFTParams,
        *,
        pad_token_id: int,
        seed: int = 0,
        checkpoint_dir: str | Path | None = None,
        on_metrics: Callable[[int, dict[str, float]], None] | None = None,
        zero: DeepSpeedParams | None = None,
        ranks: Ranks | None = None,
    ):
        if not examples:
            raise ValueError("SFT needs at least one example")
        self.ranks = ranks if ranks is not None else current_ranks()
        size = config.micro_batch_size or config.batch_size
        if self.ranks.parallel and zero is not None and zero.zero_stage is not None \
                and config.batch_size % (self.ranks.world_size * size):
            # ZeRO's collectives run in every micro-batch's backward (ZeRO-3's in its forward too): equal counts
            raise ValueError(f"sft.batch_size ({config.batch_size}) must be a multiple of the ranks "
                             f"({self.ranks.world_size}) x sft.micro_batch_size ({size}) under ZeRO, so every rank "
                             f"runs as many micro-batches")
        self.policy, self.config = policy, config
        self.examples = [
            SFTExample(e.input_ids[: config.max_length], e.loss_mask[: config.max_length]) for e in examples
        ]
        self.pad_token_id, self.on_metrics = pad_token_id, on_metrics
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.sampler = PromptSampler(len(self.examples), seed, True)
        self.optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=config.lr,
                                           weight_decay=config.weight_decay)
        self.scheduler = lr_scheduler(self.optimizer, config, self.total_steps)
        self.stepper = make_stepper(policy.model, self.optimizer, zero, max_grad_norm=config.max_grad_norm,
                                    ranks=self.ranks)
        self.optimizer = self.stepper.optimizer  # DeepSpeed's ZeRO optimizer when zero names a stage
        self.step_count = 0
        self.history: list[dict[str, float]] = []
        self.packs = config.prefix_packing and takes_packs(policy.model)

    @property
    def total_steps(self) -> int:
        steps = self.config.epochs * math.ceil(len(self.examples) / self.config.batch_size)
        return min(steps, self.config.max_steps) if self.config.max_steps else steps

    def step(self) -> dict[str, float]:
        c = self.config
        rows = [self.examples[i] for i in self.sampler.next(c.batch_size)]
        mask_all = [m for e in rows for m in e.loss_mask]
        num_tokens = float(sum(mask_all))
        num_seqs = float(sum(1 for e in rows if any(e.loss_mask)))
        batch_rows = len(rows)
        rows = self.ranks.share(rows)  # this rank's (the counts above are the whole batch's)
        self.policy.model.train()
        self.stepper.zero_grad()
        lr = self.optimizer.param_groups[0]["lr"]  # this step's (the scheduler steps after it)
        total = 0.0
        device = self.policy.device
        size = c.micro_batch_size or c.batch_size
        starts = range(0, len(rows), size)
        pass_tokens = 0
        for start in starts:
            batch = collate_sft(rows[start : start + size], pad_token_id=self.pad_token_id)
            if self.packs:
                (pack,) = pack_rows(batch, range(len(batch.input_ids)), None)
                with kept_if_short(self.policy.model, len(pack), c.checkpoint_min_tokens):
                    logp, _ = packed_logprobs(self.policy, batch, pack)
                mask, pass_tokens = batch.loss_mask[pack.rows], pass_tokens + len(pack)
            else:
                with kept_if_short(self.policy.model, batch.input_ids.numel(), c.checkpoint_min_tokens):
                    logp = self.policy.token_logprobs(batch.input_ids.to(device), batch.attention_mask.to(device),
                                                      positions=batch.loss_mask)
                mask, pass_tokens = batch.loss_mask, pass_tokens + batch.input_ids.numel()
            loss = aggregate(-logp, mask.to(device), c.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs)
            self.stepper.backward(loss, boundary=start == starts[-1])
            total += float(loss.detach())
        grad_norm = self.stepper.step(self.policy.trainable_parameters(), c.max_grad_norm)
        if self.ranks.parallel:
            total, pass_tokens = self.ranks.sum([total, pass_tokens])
        self.scheduler.step()
        self.step_count += 1
        metrics = {"step": float(self.step_count), "loss": total, "tokens": num_tokens, "rows": float(batch_rows),
                   "pass_tokens": float(pass_tokens),
                   "grad_norm": grad_norm, "lr": lr, "epoch": self.step_count * c.batch_size / len(self.examples)}
        self.history.append(metrics)
        if self.on_metrics is not None and self.ranks.main:
            self.on_metrics(self.step_count, metrics)
        if self.checkpoint_dir is not None and c.checkpoint_every and self.step_count % c.checkpoint_every == 0:
            self.save()
        return metrics

    def train(self, num_steps: int | None = None, *, progress: str | None = None) -> list[dict[str, float]]:
        """Run optimizer steps until ``step_count`` reaches ``num_steps`` (default: ``epochs`` passes).
        ``progress`` names a progress bar (steps done, loss, time left) on stderr; None shows none."""
        target = self.total_steps if num_steps is None else num_steps
        with tqdm(total=target, initial=self.step_count, desc=progress, unit="step", disable=progress is None) as bar:
            while self.step_count < target:
                metrics = self.step()
                bar.update(1)
                bar.set_postfix(loss=f"{metrics['loss']:.3f}")
        return self.history

    def save(self, root: str | Path | None = None) -> Path:
        root = Path(root) if root is not None else self.checkpoint_dir
        if root is None:
            raise ValueError("no checkpoint directory: pass one to save() or to SFTTrainer(checkpoint_dir=)")
        return save_checkpoint(root, self.step_count, model=self.policy.model, optimizer=self.stepper.checkpointable,
                               scheduler=self.scheduler, keep_last=2, ranks=self.ranks,
                               trainer_state={"data": self.sampler.state_dict(), "history": self.history,
                                              "config": self.config.model_dump(mode="json")})

    def resume(self, path: str | Path | None = None) -> bool:
        path = Path(path) if path is not None else self.checkpoint_dir
        if path is None or (not (path / "manifest.json").exists() and latest_checkpoint(path) is None):
            return False
        ckpt = load_checkpoint(path, model=self.policy.model, optimizer=self.stepper.checkpointable, scheduler=self.scheduler,
                               optimizer_globals=self.stepper.checkpoint_globals, ranks=self.ranks)
        self.step_count = ckpt.step
        self.history = list(ckpt.trainer_state["history"])
        self.sampler.load_state_dict(ckpt.trainer_state["data"])
        return True
