"""The energy-entropy quantities of EER (eer.txt §3, §4.3, §5.2-5.5): the loop's attention with its log-partition,
the per-loop kinetic, potential and Tsallis-entropy terms of the loss (eq. 2-5), the attention energy and its
latent gradient (eq. 1), and the contraction bound of Theorem 3.2.1.

Everything a loop contributes is reduced to a few numbers inside the loop (running sums over the loops of eq. 3-5),
so no loop's attention map outlives the loop unless the caller asks for the maps (``output_attentions``).
"""

import torch

from .configuration_eer import EERConfig
from .numerics import widened


def tsallis_entropy(probabilities: torch.Tensor, q: float, dim: int = -1) -> torch.Tensor:
    """S_q(p) = (1 - sum_j p_j^q) / (q - 1) (eer.txt §5.5, App. B.1; §3.1's (1 - q) denominator would make it
    negative for q > 1). Exactly-zero (masked) probabilities contribute 0 for q > 1."""
    return (1 - probabilities.pow(q).sum(dim)) / (q - 1)


def additive_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """transformers' boolean attention mask (True = attend, SDPA's) as the additive float mask of its eager path."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)


def attention_probabilities(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float,
                            with_log_partition: bool = False):
    """softmax(q k^T * scaling + mask) in float32 (or the inputs' wider type), and (``with_log_partition``)
    log sum_j exp(a_ij).

    The loss reads the probabilities (eq. 4-5) and the trace the log-partition (E_tau of eq. 1), which the fused
    kernels of transformers' attention interface do not return. ``mask``: additive (see `additive_mask`) or None
    (every key). Returns the probabilities (batch, heads, length, keys) and the log-partition (batch, heads,
    length) or None.
    """
    logits = (widened(query) @ widened(key).transpose(-1, -2)) * scaling
    if mask is not None:
        logits = logits + mask.to(logits.dtype)
    return logits.softmax(-1), logits.logsumexp(-1) if with_log_partition else None


def attention_energy_gradient(probabilities: torch.Tensor, key: torch.Tensor, query_weight: torch.Tensor,
                              head_dim: int) -> torch.Tensor:
    """grad_Z E_tau(Z; X) for E_tau = -tau log sum_i exp(<W_Q Z, W_K x_i> / (tau sqrt d)) (eer.txt §4.3):
    -(1 / sqrt d) W_Q^T sum_i p_i W_K x_i, summed over heads (``query_weight`` is q_proj's (heads * head_dim, d)
    weight, ``key`` (batch, heads, length, head_dim)). tau cancels: it divides the logits and multiplies the log."""
    batch, heads, length, _ = key.shape
    expected_keys = (probabilities.to(key.dtype) @ key).transpose(1, 2).reshape(batch, -1, heads * head_dim)
    return -(expected_keys @ query_weight) / head_dim**0.5


def contraction_bound(query_weight: torch.Tensor, key_weight: torch.Tensor, value_weight: torch.Tensor,
                      probabilities: torch.Tensor, rows: torch.Tensor, q: float) -> torch.Tensor:
    """Theorem 3.2.1's bound on ||D_Z F(X + Z)||_op per sequence: (2 ||W_Q||_op ||W_K||_op + sqrt(sum_i [1 - (q - 1)
    S_q(r_i)]^(2/q))) ||W_V||_F, where 1 - (q - 1) S_q(r) = sum_j r_j^q; the sum runs over the real rows (``rows``:
    (batch, length)) of every head. The loop contracts where c^k < 1 (a diagnostic only: App. B.3's bound on ||X + Z||
    is loose)."""
    largest = [torch.linalg.matrix_norm(widened(weight), ord=2) for weight in (query_weight, key_weight)]
    static = 2 * largest[0] * largest[1]
    row_norms = probabilities.pow(q).sum(-1).pow(2 / q) * rows.unsqueeze(1)
    return (static + row_norms.sum((1, 2)).sqrt()) * torch.linalg.matrix_norm(widened(value_weight))


def loop_terms(previous: torch.Tensor, following: torch.Tensor, probabilities: torch.Tensor, valid: torch.Tensor,
               q: float) -> dict[str, torch.Tensor]:
    """One loop's contribution to the regularisers (eq. 3-5), over the real positions (``valid``: (batch, length)):

    - kinetic: (1/2) ||Z_t - Z_{t-1}||^2, squared Frobenius over positions x channels, mean over the batch (eq. 3);
    - potential: mean over real rows (and heads) of min_j(-log p_ij) = -log max_j p_ij (eq. 4);
    - entropy: mean over real rows (and heads) of S_q(p_i) (eq. 5).
    Means over the loops (eq. 3-5's 1/T) are the caller's.
    """
    weight = valid.to(probabilities.dtype)
    rows = weight.unsqueeze(1).expand(-1, probabilities.shape[1], -1)
    count = rows.sum().clamp_min(1)
    squared = widened(following - previous).pow(2).sum(-1)
    return {
        "kinetic": 0.5 * (squared * weight).sum() / len(weight),
        "potential": (-probabilities.amax(-1).log() * rows).sum() / count,
        "entropy": (tsallis_entropy(probabilities, q) * rows).sum() / count,
    }


def regularised_loss(task_loss: torch.Tensor, regularisers: dict[str, torch.Tensor], config: EERConfig) -> torch.Tensor:
    """Eq. 2: L = L_task + lambda_P L_pot + lambda_K L_kin + lambda_S |S_q - eta| (eq. 5's absolute value with the
    entropy target eta). Terms whose lambda is 0 are left out, so they pass no gradient."""
    weighted = {"potential": (config.lambda_potential, regularisers["potential"]),
                "kinetic": (config.lambda_kinetic, regularisers["kinetic"]),
                "entropy": (config.lambda_entropy, (regularisers["entropy"] - config.entropy_target).abs())}
    loss = task_loss
    for weight, term in weighted.values():
        if weight:
            loss = loss + weight * term
    return loss
