"""What the LoRA speed-option tests (int8 base, fused forward) run on a tiny policy: a row of token ids and a
KL-regularised loss whose log-probs, reference log-probs and adapter gradients they compare across forwards."""

import torch

IDS = torch.tensor([[2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5]])
MASK = torch.ones_like(IDS)


def loss_and_grads(policy):
    """(log-probs, reference log-probs, {parameter name: gradient}) of one backward pass of the loss."""
    logp = policy.token_logprobs(IDS, MASK)
    ref = policy.token_logprobs(IDS, MASK, reference=True)
    loss = -(logp[:, 1:] - 0.1 * (logp[:, 1:] - ref[:, 1:]) ** 2).mean()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    return logp.detach(), ref, grads
