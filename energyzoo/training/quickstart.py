"""`energyzoo quickstart`: train a tiny FEM-LM on the embedded Python documentation, report loss and
perplexity, print a sample, and save a folder that `AutoModelForCausalLM.from_pretrained` loads."""

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ..hub_cards import export_model
from ..presets import model_from_preset
from .data import pack_into_blocks, python_docs_corpus, train_bpe_tokenizer
from .loop import LoopSettings, mean_loss, train_causal_lm


@dataclass
class QuickstartReport:
    output_dir: Path
    train_loss: float
    validation_loss: float
    initial_validation_loss: float
    sample: str
    seconds: float

    @property
    def validation_perplexity(self) -> float:
        return math.exp(self.validation_loss)


def run_quickstart(
    output_dir: str | Path = "runs/quickstart",
    preset: str = "fem-lm-tiny",
    vocab_size: int = 2048,
    block_size: int = 128,
    settings: LoopSettings | None = None,
    prompt: str = "The assert statement",
    progress: bool = True,
) -> QuickstartReport:
    settings = settings or LoopSettings()
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    train_texts, validation_texts = python_docs_corpus(validation_fraction=0.1)
    tokenizer = train_bpe_tokenizer(train_texts, vocab_size)
    train_blocks = pack_into_blocks(train_texts, tokenizer, block_size)
    validation_blocks = pack_into_blocks(validation_texts, tokenizer, block_size)
    model = model_from_preset(
        preset,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        max_position_embeddings=max(block_size, 512),
    )
    initial_validation = mean_loss(model, validation_blocks)
    losses = train_causal_lm(model, train_blocks, settings, progress=progress)
    validation = mean_loss(model, validation_blocks)

    prompt_ids = tokenizer(prompt, return_tensors="pt")
    generated = model.generate(**prompt_ids, max_new_tokens=40, do_sample=False, repetition_penalty=1.2,
                               pad_token_id=tokenizer.pad_token_id)
    sample = tokenizer.decode(generated[0], skip_special_tokens=True)

    output_dir = export_model(model, output_dir, tokenizer)
    reloaded = AutoModelForCausalLM.from_pretrained(output_dir)  # the folder is a real checkpoint
    with torch.no_grad():
        probe = validation_blocks[:1]
        assert torch.allclose(reloaded(probe).logits, model(probe).logits, atol=1e-5)
    train_tail = sum(losses[-20:]) / len(losses[-20:])
    return QuickstartReport(output_dir, train_tail, validation, initial_validation, sample,
                            time.perf_counter() - started)
