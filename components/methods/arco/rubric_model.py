"""ARCO's rubric model mu: one causal-LM backbone with its own LoRA adapter (``arco_mu``) and two heads, the LM head
writing K numbered criteria for a step and a :class:`ScoreHead` scoring them from the backbone's last hidden state
in the same forward pass (the step reward: the mean of the K scores), with a frozen reference adapter for the
generation head's KL term (:class:`RubricModel`).

    mu = RubricModel(model, tokenizer, lora=LoRASettings(r=8, alpha=16), k=3)
    samples = mu.write([step_messages(q, steps, t, 3) for t in range(len(steps))], temperature=0.7)
    out = mu.forward(samples)                 # out.step_rewards [B], out.scores [B, K], out.logp [B, T]
    kl, tokens = mu.kl_per_sample(out)        # per step: KL summed over its criteria tokens, and their count
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from components.llm.base import Message
from components.methods.arco.criteria import WarmupRow, parse_criteria, sft_segments
from components.training.engines.rollout import (
    HFRolloutEngine,
    RolloutBatch,
    RolloutSegment,
    SamplingParams,
    assemble,
    token_budget_groups,
)
from components.training.grpo.agent_rollout import chat_template_renderer
from components.training.losses import kl_k3
from components.training.model import (
    LoRASettings,
    Policy,
    kept_if_short,
    lora_execution,
    recompute_activations,
)
from components.training.speed.prefix_pack import PrefixPack, pack_rows, packed_logprobs, takes_packs

__all__ = ["ADAPTER", "REFERENCE", "CriteriaSample", "MuForward", "RubricModel", "ScoreHead", "full_vocab_kl"]

ADAPTER, REFERENCE = "arco_mu", "arco_mu_ref"
RELEASED_WIDTHS = (512, 128)  # zihangtian/ARCO@5974454e src/training/dual_head_mu.py:29-36
KL_CHUNK = 128  # criteria tokens whose [tokens, vocabulary] log-probs exist at once in full_vocab_kl


class ScoreHead(nn.Module):
    """Scores per hidden-state vector, ``[..., H] -> [..., outputs]``, computed in the head's own dtype (float32).

    ``form="mlp3_tanh"``: ``Linear(H, 512) -> GELU -> Linear(512, 128) -> GELU -> Linear(128, outputs) -> tanh``,
    the released code's head (each score in [-1, 1]); ``form="mlp2"``: ``Linear(H, width) -> tanh ->
    Linear(width, outputs)``, unbounded."""

    def __init__(self, hidden_size: int, width: int = 128, *, form: str = "mlp3_tanh", outputs: int = 1):
        super().__init__()
        if form == "mlp3_tanh":
            a, b = RELEASED_WIDTHS
            layers = [nn.Linear(hidden_size, a), nn.GELU(), nn.Linear(a, b), nn.GELU(), nn.Linear(b, outputs), nn.Tanh()]
        elif form == "mlp2":
            layers = [nn.Linear(hidden_size, width), nn.Tanh(), nn.Linear(width, outputs)]
        else:
            raise ValueError(f"arco.score_head: unknown form {form!r} (mlp3_tanh or mlp2)")
        self.net = nn.Sequential(*layers)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.net(hidden.to(self.net[0].weight.dtype))


def full_vocab_kl(hidden: torch.Tensor, ref_hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
    """``KL(ref || mu)`` over the whole vocabulary at each of ``N`` positions, ``[N, H] x 2 -> [N]``: the LM head
    applied to mu's and the reference's last hidden states there, ``sum_v p_ref(v) (log p_ref(v) - log p_mu(v))``
    (what ``F.kl_div(logp_mu, logp_ref, log_target=True).sum(-1)`` computes). Gradient reaches ``hidden`` only;
    the ``[N, V]`` log-probs are recomputed in backward, a chunk of tokens at a time, never all kept."""

    def chunk(h: torch.Tensor, h_ref: torch.Tensor) -> torch.Tensor:
        logq = torch.log_softmax(lm_head(h).float(), dim=-1)
        with torch.no_grad():
            logr = torch.log_softmax(lm_head(h_ref).float(), dim=-1)
        return (logr.exp() * (logr - logq)).sum(dim=-1)

    parts = []
    for start in range(0, hidden.shape[0], KL_CHUNK):
        h, h_ref = hidden[start : start + KL_CHUNK], ref_hidden[start : start + KL_CHUNK]
        parts.append(checkpoint(chunk, h, h_ref, use_reentrant=False) if h.requires_grad else chunk(h, h_ref))
    return torch.cat(parts) if parts else hidden.new_zeros(0)


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
    """One forward pass of mu over samples: per-token log-probs of the reply tokens (``mask``), the scores
    ``[B, K]`` (``valid`` marks real ones: every slot under mean pooling, the criteria written under
    criterion_end), the step rewards ``[B]`` (mean of valid scores), the assembled batch with the passes it ran
    in (for the reference pass) and, for the full-vocabulary KL, the last hidden states that predict each reply
    token ``[B, R, H]`` (None under k3)."""

    batch: RolloutBatch
    logp: torch.Tensor
    mask: torch.Tensor
    scores: torch.Tensor
    valid: torch.Tensor
    step_rewards: torch.Tensor
    units: list
    reply_hidden: torch.Tensor | None = None


class RubricModel:
    """mu: a LoRA adapter (and its frozen reference copy) on a causal LM, plus the score head.

    The score head reads, by default as the released code does, the hidden states averaged over the step's tokens
    (``score_readout="mean_pool"``: K scores in [-1, 1]), or one score per criterion at its last token
    (``"criterion_end"``). The reference ``arco_mu_ref`` is a frozen copy of ``arco_mu`` taken by
    :meth:`snapshot_reference` after the warm-up; the KL is measured at the criteria tokens mu wrote
    (``kl_estimator``: the exact KL(ref || mu) over the vocabulary, as the released code, or the k3 estimate of
    KL(mu || ref) at the written token). Nothing else trains: base weights stay frozen, and when mu shares the
    policy's base its forward and backward passes run inside :meth:`adapter`, so gradients reach neither the
    policy's adapter nor the reference.

    ``model`` is a plain causal LM (mu gets its own base) or a peft model (mu's adapters join it; the adapter
    that was active stays active outside :meth:`adapter`). ``engine`` samples criteria (default: transformers
    ``generate`` on the model itself, under mu's adapter). On its own base, ``int8_base`` and ``fused_lora`` are the
    policy's speed options (:func:`components.training.model.lora_execution`); the fused forward computes peft's
    numbers, so it serves mu's adapter and its reference alike (one adapter is active at a time).

    ``micro_batch_tokens`` splits one forward pass over samples into passes over length-sorted groups of at most
    that many padded tokens (:func:`components.training.engines.rollout.token_budget_groups`): a trajectory's
    step prompts grow step by step, and one padded batch pads every step to its last. With
    ``gradient_checkpointing``, a forward pass whose groups hold fewer than ``checkpoint_min_tokens`` padded
    tokens in all keeps its activations instead of recomputing them (every group's graph lives until the
    caller's backward pass).

    ``prefix_packing`` runs the steps instead as shared-prefix packs of at most ``micro_batch_tokens`` tokens
    (:mod:`components.training.speed.prefix_pack`): step t's prompt holds the question and steps 1..t-1, as
    step t+1's does, so one pass computes that prefix once for every step that shares it, and each step's own
    tail and criteria attend to it through a 4D mask. The numbers are the padded passes' to float rounding.

    ``score_head``, ``score_readout`` and ``kl_estimator`` are ``arco``'s options of those names (the released
    code's by default)."""

    def __init__(self, model: nn.Module, tokenizer: Any, *, lora: LoRASettings | None = None, head_width: int = 128,
                 k: int = 3, engine: Any = None, render: Any = None, seed: int = 0, write_batch: int | None = None,
                 gradient_checkpointing: bool = False, int8_base: bool = False, fused_lora: bool = False,
                 micro_batch_tokens: int | None = None, checkpoint_min_tokens: int = 0, prefix_packing: bool = False,
                 score_head: str = "mlp3_tanh", score_readout: str = "mean_pool", kl_estimator: str = "full"):
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
        if score_readout not in ("mean_pool", "criterion_end"):
            raise ValueError(f"arco.score_readout: unknown readout {score_readout!r} (mean_pool or criterion_end)")
        if kl_estimator not in ("full", "k3"):
            raise ValueError(f"arco.kl_estimator: unknown estimator {kl_estimator!r} (full or k3)")
        if kl_estimator == "full" and hasattr(model.get_output_embeddings(), "lora_A"):
            raise ValueError("arco.kl_estimator=full reads the LM head outside mu's adapter: it must carry no LoRA")
        self.model, self.tokenizer, self.k = model, tokenizer, k
        self.score_readout, self.kl_estimator = score_readout, kl_estimator
        self.micro_batch_tokens, self.checkpoint_min_tokens = micro_batch_tokens, checkpoint_min_tokens
        self.prefix_packing = prefix_packing and takes_packs(model)  # a flash-attention model runs padded passes
        self.render = render or chat_template_renderer(tokenizer)
        self.pad_token_id = getattr(tokenizer, "pad_token_id", None) or 0
        device = next(model.parameters()).device
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.head = ScoreHead(model.get_base_model().config.hidden_size, head_width, form=score_head,
                                  outputs=k if score_readout == "mean_pool" else 1).to(device)
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
        return self.lora_parameters() + list(self.head.parameters())

    def lora_parameters(self) -> list[nn.Parameter]:
        """mu's adapter's LoRA weights."""
        return [p for n, p in self.model.named_parameters() if f".{ADAPTER}." in n]

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
        with no readable numbered criterion gives a sample with no criteria (scored under mean pooling only)."""
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

    def _passes(self, batch: RolloutBatch, units: list, reads: Sequence[Sequence[Sequence[int]]] = ()
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Reply log-probs ``[B, T]`` of the active adapter and, for each read (token positions per row), the
        last hidden states there ``[B, P, H]`` (P: the read's longest row; a shorter row reads its first token for
        the rest): one forward pass per shared-prefix pack (``prefix_packing``) or per padded group, rows back in
        order."""
        run = self._packed_passes if self.prefix_packing else self._padded_passes
        pieces, order = run(batch, units, reads)
        restore = torch.argsort(torch.tensor(order))
        logp = torch.cat([lp for lp, _ in pieces])[restore]
        read = [torch.cat([got[i] for _, got in pieces])[restore] for i in range(len(reads))]
        return logp, read

    def _padded_passes(self, batch: RolloutBatch, groups: list[list[int]], reads: Sequence[Sequence[Sequence[int]]]
                       ) -> tuple[list, list[int]]:
        device, width = self._lm.device, batch.input_ids.shape[1]
        pieces, order = [], []
        for rows in groups:
            sub = batch.select(rows)
            logp, states = self._lm.forward_logprobs(
                sub.input_ids.to(device), sub.attention_mask.to(device), positions=sub.loss_mask,
                output_hidden_states=bool(reads))
            got = []
            for picks in reads:
                index = _pick_index([picks[r] for r in rows], width=_width(picks)).to(device)
                got.append(states[torch.arange(len(rows), device=device)[:, None], index])
            pieces.append((torch.nn.functional.pad(logp, (0, width - logp.shape[1])), got))
            order += rows
        return pieces, order

    def _packed_passes(self, batch: RolloutBatch, packs: list[PrefixPack], reads: Sequence[Sequence[Sequence[int]]]
                       ) -> tuple[list, list[int]]:
        pieces, order = [], []
        for pack in packs:
            logp, states = packed_logprobs(self._lm, batch, pack, hidden=bool(reads))
            got = []
            for picks in reads:
                where = _pick_index([pack.index[j][list(picks[r])].tolist() for j, r in enumerate(pack.rows)],
                                    width=_width(picks))
                got.append(states[where.to(states.device)])
            pieces.append((logp, got))
            order += pack.rows
        return pieces, order

    @staticmethod
    def _reply_reads(batch: RolloutBatch) -> list[list[int]]:
        """Per row, the positions whose last hidden state predicts a reply token (each reply token's predecessor)."""
        return [(torch.nonzero(row, as_tuple=True)[0] - 1).tolist() for row in batch.loss_mask.bool()]

    def scorable(self, sample: CriteriaSample) -> bool:
        """Whether the score head can score ``sample``: always under mean pooling, with a criterion otherwise."""
        return self.score_readout == "mean_pool" or bool(sample.ends)

    def forward(self, samples: Sequence[CriteriaSample]) -> MuForward:
        """Reply log-probs and scores under mu's adapter (gradient when grad mode is on). Under criterion_end every
        sample must have at least one criterion.

        mean_pool averages the last hidden states over each row's tokens, prompt and reply (the released
        ``DualHeadMu.forward_score``), and the head gives K scores from that one vector; criterion_end reads the
        hidden state at each criterion's last token, a score each."""
        if not all(self.scorable(s) for s in samples):
            raise ValueError("a sample without criteria cannot be scored (arco.score_readout=criterion_end)")
        batch = self._batch(samples)
        device = self._lm.device
        units = self._units(batch)
        kept = kept_if_short(self.model, self._unit_tokens(batch, units), self.checkpoint_min_tokens)
        pooled = self.score_readout == "mean_pool"
        lengths = [len(s.prompt_ids) + len(s.criteria_ids) for s in samples]
        picks = [list(range(n)) for n in lengths] if pooled else [[len(s.prompt_ids) + e for e in s.ends] for s in samples]
        reads = [picks] + ([self._reply_reads(batch)] if self.kl_estimator == "full" else [])
        with self.adapter(ADAPTER), kept:
            logp, got = self._passes(batch, units, reads)
        picked = got[0]
        width = _width(picks)
        real = torch.tensor([[j < len(p) for j in range(width)] for p in picks], device=device)
        if pooled:
            n = torch.tensor(lengths, device=device, dtype=picked.dtype)[:, None]
            scores = self.head((picked * real[..., None]).sum(dim=1) / n)
            valid = torch.ones_like(scores, dtype=torch.bool)
        else:
            valid = real
            scores = torch.where(valid, self.head(picked)[..., 0], torch.zeros((), device=device))
        step_rewards = scores.sum(dim=1) / valid.sum(dim=1)
        return MuForward(batch, logp, batch.loss_mask.to(device), scores, valid, step_rewards, units,
                         got[1] if self.kl_estimator == "full" else None)

    def kl_per_sample(self, out: MuForward) -> tuple[torch.Tensor, torch.Tensor]:
        """The generation head's KL to its warm-up reference, summed over each sample's reply tokens ``[B]``, and
        their counts ``[B]``: the exact KL(ref || mu) over the vocabulary at each token (``full``) or the k3
        estimate of KL(mu || ref) at the written token (``k3``). Gradient reaches mu's adapter only."""
        device = self._lm.device
        mask = out.mask
        if self.kl_estimator == "k3":
            with self.adapter(REFERENCE), torch.no_grad():
                ref, _ = self._passes(out.batch, out.units)
            per_token = torch.where(mask, kl_k3(out.logp, ref), torch.zeros((), device=device))
            return per_token.sum(dim=1), mask.sum(dim=1)
        if out.reply_hidden is None:
            raise ValueError("kl_estimator=full needs the hidden states mu.forward keeps under it")
        reads = self._reply_reads(out.batch)
        with self.adapter(REFERENCE), torch.no_grad():
            _, (ref_hidden,) = self._passes(out.batch, out.units, [reads])
        width = _width(reads)
        real = torch.tensor([[j < len(p) for j in range(width)] for p in reads], device=device)
        kl = full_vocab_kl(out.reply_hidden[real], ref_hidden[real], self.model.get_output_embeddings())
        per_token = torch.zeros(real.shape, device=device, dtype=kl.dtype).masked_scatter(real, kl)
        return per_token.sum(dim=1), real.sum(dim=1)

    def kl_to_reference(self, out: MuForward) -> tuple[torch.Tensor, int]:
        """The KL of :meth:`kl_per_sample` summed over every reply token of ``out``, and their count."""
        sums, counts = self.kl_per_sample(out)
        return sums.sum(), int(counts.sum())

    @torch.no_grad()
    def score(self, samples: Sequence[CriteriaSample], micro_batch: int = 8) -> list[float | None]:
        """Step rewards without gradient (eval mode); None for a sample it cannot score (:meth:`scorable`)."""
        out: list[float | None] = [None] * len(samples)
        ready = [i for i, s in enumerate(samples) if self.scorable(s)]
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


def _width(picks: Sequence[Sequence[int]]) -> int:
    return max((len(p) for p in picks), default=0)


def _pick_index(picks: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """``[len(picks), width]`` positions, each row padded with 0 (read, then masked out by the caller)."""
    index = torch.zeros((len(picks), width), dtype=torch.long)
    for j, p in enumerate(picks):
        index[j, : len(p)] = torch.as_tensor(list(p), dtype=torch.long)
    return index
