"""ARCO's rubric model mu: one causal-LM backbone with its own LoRA adapter and two heads.

- **generation head**: the LM head, writing K numbered criteria for a step (prompt from
  :func:`components.methods.arco.criteria.step_messages`);
- **score head**: :class:`ScoreHead`, a small MLP on the backbone's last hidden state read at the last token of
  each criterion (in one forward pass over ``[prompt | criteria]``): one score per criterion, their mean is
  the step reward.

mu's weights are the peft adapter ``arco_mu`` plus the score head. A second adapter, ``arco_mu_ref``, holds a
frozen copy of ``arco_mu`` taken by :meth:`RubricModel.snapshot_reference` after the warm-up: the generation
head's KL term is measured against it (k3 estimator on the criteria tokens mu wrote). Nothing else trains:
base weights stay frozen, and when mu shares a base with the policy (``model`` is the policy's
``PeftModel``; mu's adapters are added beside the policy's and the active adapter is switched only inside
:meth:`RubricModel.adapter`, in which mu's forward *and backward* passes run), gradients reach neither the
policy's adapter nor the reference.

    mu = RubricModel(model, tokenizer, lora=LoRASettings(r=8, alpha=16), head_width=128, k=3)
    samples = mu.write([step_messages(q, steps, t, 3) for t in range(len(steps))], temperature=0.7)
    out = mu.forward(samples)                 # out.step_rewards [B], out.scores [B, K], out.logp [B, T]
    kl = mu.kl_to_reference(samples, out)     # mean k3 over the criteria tokens
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from components.llm.base import Message
from components.methods.arco.criteria import WarmupRow, parse_criteria, sft_segments
from components.training.agent_rollout import chat_template_renderer
from components.training.losses import kl_k3
from components.training.model import (
    LoRASettings,
    Policy,
    kept_if_short,
    lora_execution,
    recompute_activations,
)
from components.training.prefix_pack import PrefixPack, pack_rows, packed_logprobs, takes_packs
from components.training.rollout import (
    HFRolloutEngine,
    RolloutBatch,
    RolloutSegment,
    SamplingParams,
    assemble,
    token_budget_groups,
)

__all__ = ["ADAPTER", "REFERENCE", "CriteriaSample", "MuForward", "RubricModel", "ScoreHead"]

ADAPTER, REFERENCE = "arco_mu", "arco_mu_ref"


class ScoreHead(nn.Module):
    """``Linear(H, width) -> tanh -> Linear(width, 1)``: a score per hidden-state vector ``[..., H] -> [...]``."""

    def __init__(self, hidden_size: int, width: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden_size, width), nn.Tanh(), nn.Linear(width, 1))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden).squeeze(-1)


@dataclass
class CriteriaSample:
    """One step's criteria as token ids: the rendered prompt, the reply (criteria and end-of-turn tokens), the
    criteria texts and, for each, the index in ``criteria_ids`` of its last token (where it is scored)."""

    prompt_ids: list[int]
    criteria_ids: list[int]
    criteria: list[str]
    ends: list[int]


@dataclass
class MuForward:
    """One forward pass of mu over samples: per-token log-probs of the reply tokens (``mask``), the score of
    each criterion ``[B, K]`` (``valid`` marks real criteria), the step rewards ``[B]`` (mean of valid scores),
    and the assembled batch with the passes it ran in (for the reference pass)."""

    batch: RolloutBatch
    logp: torch.Tensor
    mask: torch.Tensor
    scores: torch.Tensor
    valid: torch.Tensor
    step_rewards: torch.Tensor
    units: list


class RubricModel:
    """mu: a LoRA adapter (and its frozen reference copy) on a causal LM, plus the score head.

    ``model`` is a plain causal LM (mu gets its own base) or a peft model (mu's adapters join it; the adapter
    that was active stays active outside :meth:`adapter`). ``engine`` samples criteria (default: transformers
    ``generate`` on the model itself, under mu's adapter). On its own base, ``int8_base`` and ``fused_lora`` are the
    policy's speed options (:func:`components.training.model.lora_execution`); the fused forward computes peft's
    numbers, so it serves mu's adapter and its reference alike (one adapter is active at a time).

    ``micro_batch_tokens`` splits one forward pass over samples into passes over length-sorted groups of at most
    that many padded tokens (:func:`components.training.rollout.token_budget_groups`): a trajectory's step prompts
    grow step by step, and one padded batch pads every step to its last. With ``gradient_checkpointing``, a
    forward pass whose groups hold fewer than ``checkpoint_min_tokens`` padded tokens in all keeps its
    activations instead of recomputing them (every group's graph lives until the caller's backward pass).

    ``prefix_packing`` runs the steps instead as shared-prefix packs of at most ``micro_batch_tokens`` tokens
    (:mod:`components.training.prefix_pack`): step t's prompt holds the question and steps 1..t-1, as step t+1's
    does, so one pass computes that prefix once for every step that shares it, and each step's own tail and
    criteria attend to it through a 4D mask. The numbers are the padded passes' to float rounding."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, lora: LoRASettings | None = None, head_width: int = 128,
                 k: int = 3, engine: Any = None, render: Any = None, seed: int = 0, write_batch: int | None = None,
                 gradient_checkpointing: bool = False, int8_base: bool = False, fused_lora: bool = False,
                 micro_batch_tokens: int | None = None, checkpoint_min_tokens: int = 0, prefix_packing: bool = False):
        from peft import LoraConfig, PeftModel, get_peft_model

        lora = lora or LoRASettings()
        config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=list(lora.target_modules), bias=lora.bias, task_type="CAUSAL_LM")
        self.shared = isinstance(model, PeftModel)
        if self.shared and (int8_base or fused_lora):
            raise ValueError("int8_base / fused_lora: on a shared base mu runs as the policy was built; set them there")
        if self.shared:
            previous = model.active_adapter
            model.add_adapter(ADAPTER, config)
            model.add_adapter(REFERENCE, config)
            model.set_adapter(previous)
        else:
            if gradient_checkpointing:  # its own base: recompute activations in backward (generation keeps its cache)
                recompute_activations(model)
            model = get_peft_model(model, config, adapter_name=ADAPTER)
            model.add_adapter(REFERENCE, config)
            lora_execution(model, int8_base=int8_base, fused_lora=fused_lora)
        for n, p in model.named_parameters():
            if f".{REFERENCE}." in n:
                p.requires_grad_(False)
        self.model, self.tokenizer, self.k = model, tokenizer, k
        self.micro_batch_tokens, self.checkpoint_min_tokens = micro_batch_tokens, checkpoint_min_tokens
        self.prefix_packing = prefix_packing and takes_packs(model)  # a flash-attention model runs padded passes
        self.render = render or chat_template_renderer(tokenizer)
        self.pad_token_id = getattr(tokenizer, "pad_token_id", None) or 0
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.head = ScoreHead(model.get_base_model().config.hidden_size, head_width).to(device)
        self._lm = Policy(model, is_lora=True)
        self.engine = engine if engine is not None else HFRolloutEngine(model, tokenizer, max_batch_size=write_batch)
        self.snapshot_reference()

    # -- adapters -------------------------------------------------------------------------------------------
    @contextmanager
    def adapter(self, name: str) -> Iterator[None]:
        """Run with adapter ``name`` active (peft makes it the trainable one), then restore the adapter that was
        active and every parameter's ``requires_grad``. On a shared base mu's adapter is frozen outside this
        scope (so the policy's optimizer never holds it): run mu's backward pass inside
        ``with mu.adapter(ADAPTER):``."""
        previous = self.model.active_adapter
        flags = [(p, p.requires_grad) for p in self.model.parameters()]
        self.model.set_adapter(name)
        try:
            yield
        finally:
            self.model.set_adapter(previous)
            for p, flag in flags:
                p.requires_grad_(flag)

    def adapter_state(self, name: str = ADAPTER) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model, adapter_name=name).items()}

    def load_adapter_state(self, state: dict[str, torch.Tensor], name: str = ADAPTER) -> None:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        expected = set(get_peft_model_state_dict(self.model, adapter_name=name))
        if set(state) != expected:
            raise ValueError(f"adapter {name!r} does not fit mu: missing {sorted(expected - set(state))[:3]}, "
                             f"unexpected {sorted(set(state) - expected)[:3]}")
        set_peft_model_state_dict(self.model, state, adapter_name=name)

    def publish(self, step: int) -> None:
        """Hand mu's adapter as it is now to its engine: an engine that samples from a copy of the weights (a
        llama.cpp server) serves it from the next :meth:`write` on; transformers' engine runs on the model itself
        and has nothing to do."""
        with self.adapter(ADAPTER):
            self.engine.update_weights(self._lm, step)

    def close(self) -> None:
        """Stop an engine that runs outside this process."""
        if hasattr(self.engine, "close"):
            self.engine.close()

    def snapshot_reference(self) -> None:
        """The generation head's KL reference becomes a frozen copy of mu's adapter as it is now."""
        self.load_adapter_state(self.adapter_state(ADAPTER), REFERENCE)

    def parameters(self) -> list[nn.Parameter]:
        """What mu's optimizer trains: its adapter's LoRA weights and the score head."""
        lora = [p for n, p in self.model.named_parameters() if f".{ADAPTER}." in n]
        return lora + list(self.head.parameters())

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Adapter, reference and score head, as one flat tensor dict (for a safetensors file)."""
        out = {f"adapter/{k}": v for k, v in self.adapter_state(ADAPTER).items()}
        out.update({f"reference/{k}": v for k, v in self.adapter_state(REFERENCE).items()})
        out.update({f"head/{k}": v.detach().clone() for k, v in self.head.state_dict().items()})
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        part = lambda prefix: {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        self.load_adapter_state(part("adapter/"), ADAPTER)
        self.load_adapter_state(part("reference/"), REFERENCE)
        self.head.load_state_dict(part("head/"))

    # -- samples --------------------------------------------------------------------------------------------
    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def target_sample(self, row: WarmupRow) -> CriteriaSample:
        """A warm-up row (teacher criteria as the reply) as token ids, segment by segment."""
        segments = sft_segments(row, self.render)
        prompt = self._encode(segments[0][0])
        ids: list[int] = []
        ends: list[int] = []
        for text, _ in segments[1:]:
            ids += self._encode(text)
            if text != "\n" and len(ends) < len(row.criteria):
                ends.append(len(ids) - 1)
        return CriteriaSample(prompt, ids, list(row.criteria), ends)

    def _sample_from_reply(self, prompt: list[int], ids: list[int]) -> CriteriaSample:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        parsed = parse_criteria(text, self.k)
        lengths = [len(self.tokenizer.decode(ids[: j + 1], skip_special_tokens=True)) for j in range(len(ids))]
        ends = [next(j for j, n in enumerate(lengths) if n >= end) for _, end in parsed]
        return CriteriaSample(prompt, list(ids), [c for c, _ in parsed], ends)

    def write(self, conversations: Sequence[list[Message]], *, temperature: float = 0.7,
              max_tokens: int = 96) -> list[CriteriaSample]:
        """mu's generation head writes criteria for each conversation (one batch, under mu's adapter). A reply
        with no readable numbered criterion gives a sample with no criteria (its step goes unscored)."""
        if not conversations:
            return []
        prompts = [self._encode(self.render(list(m), True)) for m in conversations]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        sampling = SamplingParams(max_new_tokens=max_tokens, temperature=temperature,
                                  stop_token_ids=() if eos is None else (int(eos),))
        with self.adapter(ADAPTER):
            gens = self.engine.generate(prompts, sampling)
        return [self._sample_from_reply(p, list(g.token_ids)) for p, g in zip(prompts, gens, strict=True)]

    # -- forward passes -------------------------------------------------------------------------------------
    def _batch(self, samples: Sequence[CriteriaSample]) -> RolloutBatch:
        rows = [[RolloutSegment(s.prompt_ids, False), RolloutSegment(s.criteria_ids, True)] for s in samples]
        return assemble(rows, pad_token_id=self.pad_token_id)

    def groups(self, batch: RolloutBatch) -> list[list[int]]:
        """The rows of ``batch`` that share one padded forward pass (``micro_batch_tokens``)."""
        return token_budget_groups(batch.attention_mask.sum(dim=1).tolist(), self.micro_batch_tokens)

    def packs(self, batch: RolloutBatch) -> list[PrefixPack]:
        """The rows of ``batch`` as shared-prefix packs of at most ``micro_batch_tokens`` tokens each."""
        return pack_rows(batch, range(len(batch)), self.micro_batch_tokens)

    def _units(self, batch: RolloutBatch) -> list:
        """The forward passes over ``batch``: its shared-prefix packs (``prefix_packing``) or its padded groups."""
        return self.packs(batch) if self.prefix_packing else self.groups(batch)

    def _unit_tokens(self, batch: RolloutBatch, units: list) -> int:
        if self.prefix_packing:
            return sum(len(p) for p in units)
        lengths = batch.attention_mask.sum(dim=1).tolist()
        return sum(len(g) * max(lengths[i] for i in g) for g in units)

    def pass_tokens(self, samples: Sequence[CriteriaSample]) -> int:
        """Tokens, padding included, of the forward passes :meth:`forward` runs over ``samples``."""
        batch = self._batch(samples)
        return self._unit_tokens(batch, self._units(batch))

    def _passes(self, batch: RolloutBatch, units: list, picks: Sequence[Sequence[int]] | None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Reply log-probs ``[B, T]`` of the active adapter and, given ``picks`` (token positions per row), the
        last hidden states there ``[B, K, H]`` (a row with fewer than K reads its first token for the rest):
        one forward pass per shared-prefix pack (``prefix_packing``) or per padded group, rows back in order."""
        run = self._packed_passes if self.prefix_packing else self._padded_passes
        pieces, order = run(batch, units, picks)
        restore = torch.argsort(torch.tensor(order))
        logp = torch.cat([lp for lp, _ in pieces])[restore]
        picked = torch.cat([h for _, h in pieces])[restore] if picks is not None else None
        return logp, picked

    def _padded_passes(self, batch: RolloutBatch, groups: list[list[int]], picks: Sequence[Sequence[int]] | None
                       ) -> tuple[list, list[int]]:
        device, width = self._lm.device, batch.input_ids.shape[1]
        pieces, order = [], []
        for rows in groups:
            sub = batch.select(rows)
            logp, states = self._lm.forward_logprobs(
                sub.input_ids.to(device), sub.attention_mask.to(device), positions=sub.loss_mask,
                output_hidden_states=picks is not None)
            picked = None
            if picks is not None:
                index = _pick_index([picks[r] for r in rows], width=self._pick_width(picks)).to(device)
                picked = states[torch.arange(len(rows), device=device)[:, None], index]
            pieces.append((torch.nn.functional.pad(logp, (0, width - logp.shape[1])), picked))
            order += rows
        return pieces, order

    def _packed_passes(self, batch: RolloutBatch, packs: list[PrefixPack], picks: Sequence[Sequence[int]] | None
                       ) -> tuple[list, list[int]]:
        pieces, order = [], []
        for pack in packs:
            logp, states = packed_logprobs(self._lm, batch, pack, hidden=picks is not None)
            picked = None
            if picks is not None:
                where = _pick_index([pack.index[j][list(picks[r])].tolist() for j, r in enumerate(pack.rows)],
                                    width=self._pick_width(picks))
                picked = states[where.to(states.device)]
            pieces.append((logp, picked))
            order += pack.rows
        return pieces, order

    @staticmethod
    def _pick_width(picks: Sequence[Sequence[int]]) -> int:
        return max(len(p) for p in picks)

    def forward(self, samples: Sequence[CriteriaSample]) -> MuForward:
        """Reply log-probs and criterion scores under mu's adapter (gradient when grad mode is on). Every sample
        must have at least one criterion."""
        if any(not s.ends for s in samples):
            raise ValueError("a sample without criteria cannot be scored")
        batch = self._batch(samples)
        device = self._lm.device
        units = self._units(batch)
        kept = kept_if_short(self.model, self._unit_tokens(batch, units), self.checkpoint_min_tokens)
        picks = [[len(s.prompt_ids) + e for e in s.ends] for s in samples]
        with self.adapter(ADAPTER), kept:
            logp, picked = self._passes(batch, units, picks)
        width = self._pick_width(picks)
        valid = torch.tensor([[j < len(p) for j in range(width)] for p in picks], device=device)
        scores = torch.where(valid, self.head(picked), torch.zeros((), device=device))
        step_rewards = scores.sum(dim=1) / valid.sum(dim=1)
        return MuForward(batch, logp, batch.loss_mask.to(device), scores, valid, step_rewards, units)

    def kl_to_reference(self, out: MuForward) -> tuple[torch.Tensor, int]:
        """Sum of the k3 KL (mu vs its warm-up reference) over the reply tokens of ``out``, and their count."""
        device = self._lm.device
        with self.adapter(REFERENCE), torch.no_grad():
            ref, _ = self._passes(out.batch, out.units, None)
        mask = out.mask
        per_token = torch.where(mask, kl_k3(out.logp, ref), torch.zeros((), device=device))
        return per_token.sum(), int(mask.sum())

    @torch.no_grad()
    def score(self, samples: Sequence[CriteriaSample], micro_batch: int = 8) -> list[float | None]:
        """Step rewards without gradient (eval mode); None for a sample without criteria."""
        out: list[float | None] = [None] * len(samples)
        ready = [i for i, s in enumerate(samples) if s.ends]
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(ready), micro_batch):
                chunk = ready[start : start + micro_batch]
                rewards = self.forward([samples[i] for i in chunk]).step_rewards
                for i, r in zip(chunk, rewards.tolist()):
                    out[i] = float(r)
        finally:
            self.model.train(was_training)
        return out


def _pick_index(picks: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """``[len(picks), width]`` positions, each row padded with 0 (read, then masked out by the caller)."""
    index = torch.zeros((len(picks), width), dtype=torch.long)
    for j, p in enumerate(picks):
        index[j, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    return index
