"""A small causal-LM training loop for CPU-scale runs (the quickstart): AdamW, warmup + cosine decay,
gradient clipping, a progress bar, and held-out loss / perplexity."""

import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup


@dataclass
class LoopSettings:
    steps: int = 500
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    seed: int = 42  # FEM App. K


@torch.no_grad()
def mean_loss(model, blocks: torch.Tensor, batch_size: int = 16) -> float:
    """Token-weighted mean next-token loss of ``model`` over (num_blocks, block_size) blocks."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for start in range(0, len(blocks), batch_size):
        batch = blocks[start : start + batch_size]
        tokens = batch.numel() - batch.shape[0]  # one prediction fewer than tokens per block
        total += model(input_ids=batch, labels=batch, use_cache=False).loss.item() * tokens
        count += tokens
    model.train(was_training)
    return total / count


def train_causal_lm(model, blocks: torch.Tensor, settings: LoopSettings, progress: bool = True) -> list[float]:
    """Train on random batches of ``blocks``; returns the training loss of every step."""
    generator = torch.Generator().manual_seed(settings.seed)
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings.learning_rate,
        betas=(0.9, 0.95),
    )
    schedule = get_cosine_schedule_with_warmup(optimizer, settings.warmup_steps, settings.steps)
    model.train()
    losses = []
    bar = tqdm(range(settings.steps), desc="training", disable=not progress)
    for _ in bar:
        batch = blocks[torch.randint(len(blocks), (settings.batch_size,), generator=generator)]
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}", ppl=f"{math.exp(min(loss.item(), 20)):.1f}")
    model.eval()
    return losses
