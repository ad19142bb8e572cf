"""A float64 reference of EqT's energy L(h) (eqt.txt eq. 11-15), written per position and per window slot with
Python loops from the formulas, for checking the model's vectorised energies and their hand-written gradients
(by autograd through this reference). Only the reverse encoder's states u (which do not depend on h) come from
the model."""

import math

import torch

from energyzoo.modeling.eqt_energy import position_mask


def reference_energy(model, ids: torch.Tensor, hidden: torch.Tensor, proposal: torch.Tensor,
                     valid: torch.Tensor | None = None) -> torch.Tensor:
    """L(h) per position (B, n) for a float64 `EqTLlamaForCausalLM` whose only refined site is the last layer;
    ``hidden`` is h, ``proposal`` the f that picks the relevant memories (and the top-k confidence candidates)."""
    config = model.config
    energy_net = model.model.erm.energy
    batch, length = ids.shape
    valid = torch.ones_like(ids, dtype=torch.bool) if valid is None else valid.bool()
    keys = valid.long().cumsum(-1) - 1
    embeddings = model.model.embed_tokens.weight
    projected = energy_net.embed_proj(embeddings[ids])
    with torch.no_grad():
        states = energy_net.reverse_encode(projected, valid, keys)
    window = config.erm_rev_window
    lambdas = dict(rev=config.lambda_rev, mask=config.lambda_mask, conf=config.lambda_conf, mem=config.lambda_mem)
    out = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        for t in range(length):
            h = hidden[b, t]
            slots = [(r, t - r) for r in range(window) if t - r >= 0 and valid[b, t - r]]
            window_tokens = [int(ids[b, i]) for _, i in slots]
            distinct = list(dict.fromkeys(window_tokens))

            def log_prob(output, token, distinct=distinct):
                if config.erm_head_vocabulary == "full":
                    scores = energy_net.embed_proj(embeddings) @ output
                    return scores.log_softmax(-1)[token]
                rows = torch.stack([energy_net.embed_proj(embeddings[v]) for v in distinct])
                return (rows @ output).log_softmax(-1)[distinct.index(token)]

            total = torch.zeros((), dtype=torch.float64)
            if lambdas["rev"]:
                terms = []
                for r, i in slots:
                    before = states[b, i - 1] if i - 1 >= 0 and valid[b, i - 1] else energy_net.rev_start
                    pre = before + energy_net.rev_cond.weight @ h + energy_net.rev_offset.weight[r]
                    normed = energy_net.rev_norm_weight * pre / torch.sqrt(pre.pow(2).mean() + config.rms_norm_eps)
                    terms.append(-log_prob(energy_net.rev_out.weight @ normed, int(ids[b, i])))
                total = total + lambdas["rev"] * (torch.stack(terms).mean() if terms else 0.0)
            if lambdas["mask"]:
                terms = []
                for r, i in slots:
                    if position_mask(keys[b, i:i + 1], config.erm_mask_ratio, config.erm_mask_seed).item():
                        pre = energy_net.mask_in.weight @ h + energy_net.mask_offset.weight[r]
                        gelu = 0.5 * pre * (1 + torch.erf(pre / math.sqrt(2)))
                        terms.append(-log_prob(energy_net.mask_out.weight @ gelu, int(ids[b, i])))
                total = total + lambdas["mask"] * (torch.stack(terms).mean() if terms else 0.0)
            if lambdas["conf"]:
                norm = model.model.norm
                feature = norm.weight * h / torch.sqrt(h.pow(2).mean() + norm.variance_epsilon)
                rows = model.lm_head.weight
                if config.erm_confidence_topk is not None:
                    f = proposal[b, t]
                    f_feature = norm.weight * f / torch.sqrt(f.pow(2).mean() + norm.variance_epsilon)
                    rows = rows[(rows @ f_feature).topk(config.erm_confidence_topk).indices]
                log_p = (rows @ feature).log_softmax(-1)
                total = total + lambdas["conf"] * (-(log_p.exp() * log_p).sum() - log_p.max())
            if lambdas["mem"]:
                bank = energy_net.memory_banks[0]
                f = proposal[b, t]
                cos_f = (bank @ f) / (bank.norm(dim=-1) * f.norm())
                relevant = bank[cos_f.topk(config.erm_memory_topk).indices]
                cos_h = (relevant @ h) / (relevant.norm(dim=-1) * h.norm())
                total = total + lambdas["mem"] * -torch.logsumexp(cos_h / config.erm_memory_temperature, 0)
            out[b, t] = total
    return out
