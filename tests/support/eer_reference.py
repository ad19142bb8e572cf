"""A float64 reference of EER's residual loop and loss (eer.txt §5.1, eq. 2-5),
written from the equations with plain tensor ops over the model's weights: no code of `energyzoo.modeling` runs.
Positions with ``mask`` 0 are padding: they are never attended to and not counted in the regularisers."""

import math

import torch
import torch.nn.functional as F


def sinusoid(positions: torch.Tensor, width: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/width)), PE(pos, 2i+1) = cos(...), float64."""
    frequency = 10000.0 ** (-torch.arange(0, width, 2, dtype=torch.float64) / width)
    angles = positions.double().unsqueeze(-1) * frequency
    return torch.stack([angles.sin(), angles.cos()], -1).flatten(-2)


def reference_parameters(model) -> dict[str, torch.Tensor]:
    """The model's parameters as float64 leaves that require grad (for reference gradients)."""
    return {name: p.detach().double().requires_grad_(True) for name, p in model.named_parameters()}


def reference_forward(config, weights: dict, input_ids: torch.Tensor, mask: torch.Tensor | None = None,
                      labels: torch.Tensor | None = None, loops: int | None = None) -> dict:
    """Logits, trajectory Z_0..Z_T, per-loop attention maps, the loss and its parts, and the per-loop trace values."""
    batch, length = input_ids.shape
    mask = torch.ones_like(input_ids) if mask is None else mask
    real = mask.bool()
    loops = config.num_loops if loops is None else loops
    width, heads = config.hidden_size, config.num_attention_heads
    head_dim = width // heads
    q = config.tsallis_q

    def w(name):
        return weights[name]

    def linear(x, name, bias=True):
        out = x @ w(f"{name}.weight").T
        return out + w(f"{name}.bias") if bias and f"{name}.bias" in weights else out

    def layer_norm(x, name):
        return F.layer_norm(x, (width,), w(f"{name}.weight"), w(f"{name}.bias"), config.layer_norm_eps)

    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    inputs = w("model.embed_tokens.weight")[input_ids] + config.position_embedding_scale * sinusoid(positions, width)
    allowed = torch.ones(length, length, dtype=torch.bool).tril() & real[:, None, None, :]  # (B, 1, n, n)

    post = config.norm_placement == "post"  # Z_{t+1} = LN(Z_t + F(Z_t + X)), no norm before the attention
    latent = torch.zeros_like(inputs)
    trajectory, maps, log_partitions = [latent], [], []
    for _ in range(loops):
        state = latent + inputs
        normed = layer_norm(state, "model.block.input_layernorm") if config.attention_norm and not post else state

        def split(name, normed=normed):
            return linear(normed, f"model.block.self_attn.{name}").view(batch, length, heads, head_dim).transpose(1, 2)

        scale = config.attention_temperature * math.sqrt(head_dim)
        logits = split("q_proj") @ split("k_proj").transpose(-1, -2) / scale
        logits = logits.masked_fill(~allowed, -math.inf)
        # a padding query with no real key at or before it: any finite row (it is never read)
        logits = torch.where(allowed.any(-1, keepdim=True), logits, torch.zeros_like(logits))
        probabilities = logits.softmax(-1)
        attended = (probabilities @ split("v_proj")).transpose(1, 2).reshape(batch, length, width)
        if config.attention_output_projection:
            attended = linear(attended, "model.block.self_attn.o_proj")
        hidden = linear(layer_norm(state + attended, "model.block.post_attention_layernorm"), "model.block.mlp.up_proj")
        update = attended + linear(F.gelu(hidden), "model.block.mlp.down_proj")
        latent = latent + update
        if post:  # the block's one extra LayerNorm is the output's
            latent = layer_norm(latent, "model.block.input_layernorm")
        trajectory.append(latent)
        maps.append(probabilities)
        log_partitions.append(logits.logsumexp(-1))

    logits = linear(layer_norm(latent + inputs if config.readout_with_inputs else latent, "model.norm"), "lm_head")
    result = {"logits": logits, "trajectory": trajectory, "maps": maps,
              **loss_parts(trajectory, maps, real, q)}
    rows = real[:, None, :].expand(-1, heads, -1)
    result["energy"] = torch.stack([(-config.attention_temperature * lse)[rows].mean() for lse in log_partitions])
    if labels is not None:
        task = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        result["task_loss"] = task
        result["loss"] = (task + config.lambda_potential * result["potential"]
                          + config.lambda_kinetic * result["kinetic"]
                          + config.lambda_entropy * (result["entropy"] - config.entropy_target).abs())
    return result


def loss_parts(trajectory: list[torch.Tensor], maps: list[torch.Tensor], real: torch.Tensor, q: float) -> dict:
    """Eq. 3-5 from a trajectory Z_0..Z_T and the T attention maps, in float64, over the real positions; also the
    per-loop values (``*_per_loop``)."""
    batch = real.shape[0]
    weight = real.double()
    kinetic = torch.stack([0.5 * ((after - before).double().pow(2).sum(-1) * weight).sum() / batch
                           for before, after in zip(trajectory, trajectory[1:])])
    potentials, entropies = [], []
    for probabilities in maps:
        rows = real[:, None, :].expand(-1, probabilities.shape[1], -1)
        p = probabilities.double()
        potentials.append((-p.max(-1).values.log())[rows].mean())
        entropies.append(((1 - p.pow(q).sum(-1)) / (q - 1))[rows].mean())
    potential, entropy = torch.stack(potentials), torch.stack(entropies)
    return {"kinetic": kinetic.mean(), "potential": potential.mean(), "entropy": entropy.mean(),
            "kinetic_per_loop": kinetic, "potential_per_loop": potential, "entropy_per_loop": entropy}
