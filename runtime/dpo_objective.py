"""DPO's objective (Rafailov et al. 2023; runtime/dpo.py describes the whole): sequence
log-probabilities, the per-pair loss and its statistics, the sum of partial log-probabilities
over the context-parallel ranks, and the reference log-probabilities carried through a
pipeline as one extra column of the targets.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.schema.vocab import PAD_ID

DEFAULT_BETA = 0.1
# Sums over pairs, in this order (stats tensors); "pairs" is the count.
STAT_KEYS = ("loss", "reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward", "chosen_logp",
             "rejected_logp", "logp_accuracy", "pairs")


def sequence_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over the non-pad targets of log p(target): logits [b, s, V], targets [b, s] -> [b], fp32."""
    nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1), ignore_index=PAD_ID, reduction="none")
    return -nll.view(targets.shape).sum(dim=1)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = DEFAULT_BETA, label_smoothing: float = 0.0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair DPO losses [n] and the sums over the pairs of STAT_KEYS (float64, detached)."""
    chosen = policy_chosen - ref_chosen
    rejected = policy_rejected - ref_rejected
    z = beta * (chosen - rejected)
    losses = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    with torch.no_grad():
        cr, rr = beta * chosen.double(), beta * rejected.double()
        stats = torch.stack([losses.double().sum(), (cr > rr).double().sum(), (cr - rr).sum(), cr.sum(), rr.sum(),
                             policy_chosen.double().sum(), policy_rejected.double().sum(),
                             (policy_chosen > policy_rejected).double().sum(),
                             torch.tensor(float(losses.numel()), dtype=torch.float64, device=losses.device)])
    return losses, stats


def mean_stats(sums: torch.Tensor) -> dict[str, float]:
    """STAT_KEYS sums -> means over the pairs (and the pair count)."""
    n = float(sums[-1])
    out = {k: (float(v) / n if n else float("nan")) for k, v in zip(STAT_KEYS[:-1], sums[:-1])}
    out["pairs"] = int(n)
    return out


class SumOverCP(torch.autograd.Function):
    """All-reduce (sum) over the cp group; backward: all-reduce (sum) of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def encode_reference(targets: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """targets [rows, s] int64 plus one column: ref [rows] as the bits of float64 values."""
    return torch.cat([targets, ref.detach().double().view(torch.int64)[:, None]], dim=1)


def decode_reference(target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return target[:, :-1], target[:, -1].contiguous().view(torch.float64).float()
