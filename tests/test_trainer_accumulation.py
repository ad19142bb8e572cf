"""`Trainer` with gradient accumulation takes the step of the whole batch, for every zoo head with a loss.

The reference is the same `Trainer` on the whole batch at once (no accumulation): one SGD step of 2 x 2 accumulated
micro-batches must move every parameter as one step on the 4 examples does. Heads whose loss is a per-batch mean
(eq. 2's regularisers, eq. 18's energy, the classifiers) declare ``accepts_loss_kwargs = False``, so `Trainer`
averages the micro-batches; causal LMs that normalise by ``num_items_in_batch`` get it from `Trainer`, which
keeps the step exact even when the micro-batches hold different numbers of labelled tokens.

Left out by design: a training forward that pools statistics over the batch, TEL's default "batch" entropy
pooling (tel.txt D.4) and ResNet's BatchNorm, gives each micro-batch its own statistics, as BatchNorm does."""

import copy

import pytest
import torch
from datasets import Dataset
from test_eer_contract import tiny_eer_config
from test_eqt_contract import tiny_eqt_config
from test_hyperset_heads import CODEBOOK, GRID, image_classifier, maskgit, sudoku
from test_tel_models import GPT2_FIELDS, VIT_FIELDS
from transformers import Trainer, TrainingArguments

from energyzoo import (
    EERForCausalLM,
    FEMConfig,
    FEMForCausalLM,
    FEMForSequenceClassification,
    TELGPT2LMHeadModel,
    TELViTForImageClassification,
)
from energyzoo.modeling.configuration_tel import TELGPT2Config, TELViTConfig
from energyzoo.modeling.modeling_eqt import EqTLlamaForCausalLM
from energyzoo.registry import ARCHITECTURES

LENGTH = 12


def token_batch(vocab: int, label_vocab: int | None = None, uneven: bool = False, length: int = LENGTH) -> dict:
    """Four rows of ids with per-token labels (ids themselves when ``label_vocab`` is None); ``uneven`` leaves the
    first micro-batch with fewer labelled tokens than the second."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (4, length), generator=generator)
    labels = ids.clone() if label_vocab is None else torch.randint(0, label_vocab, ids.shape, generator=generator)
    if uneven:
        labels[0, : length // 2] = -100
    return {"input_ids": ids.tolist(), "labels": labels.tolist()}


def fem_classifier():
    return FEMForSequenceClassification(FEMConfig(vocab_size=97, hidden_size=32, intermediate_size=64,
                                                  num_hidden_layers=2, num_attention_heads=4, time_decay_rank=4,
                                                  pad_token_id=0, num_labels=3))


def fem_lm():
    return FEMForCausalLM(FEMConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, time_decay_rank=4, pad_token_id=0))


def image_batch(size: int = 32) -> dict:
    generator = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(4, 3, size, size, generator=generator).tolist(), "labels": [0, 2, 1, 2]}


def hyperset_images():
    return image_classifier(num_labels=3)


WITHOUT_DROPOUT = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # GPT-2's default draws differ per run
# case: (the registered architecture and head it covers, model, batch)
CASES = {
    "eer": ("eer-looped", "causal-lm", lambda: EERForCausalLM(tiny_eer_config(num_loops=3)), lambda: token_batch(16)),
    "eqt-llama": ("eqt-llama", "causal-lm", lambda: EqTLlamaForCausalLM(tiny_eqt_config()), lambda: token_batch(97)),
    "hyperset-sudoku": ("hyperset", "token-classification", lambda: sudoku(max_position_embeddings=LENGTH),
                        lambda: token_batch(10, label_vocab=9)),
    "hyperset-maskgit": ("hyperset", "masked-image-modeling", maskgit,
                         lambda: token_batch(CODEBOOK, label_vocab=CODEBOOK, length=GRID)),
    "hyperset-images": ("hyperset", "image-classification", hyperset_images, lambda: image_batch(size=8)),
    "fem-classifier": ("fem", "sequence-classification", fem_classifier,
                       lambda: {**token_batch(97), "labels": [0, 2, 1, 2]}),
    "fem-lm, uneven labels": ("fem", "causal-lm", fem_lm, lambda: token_batch(97, uneven=True)),
    "tel-gpt2, uneven labels": ("tel-gpt2", "causal-lm", lambda: TELGPT2LMHeadModel(TELGPT2Config(
        **GPT2_FIELDS, **WITHOUT_DROPOUT, tel_placement="full")), lambda: token_batch(97, uneven=True)),
    "tel-vit, token pooling": ("tel-vit", "image-classification", lambda: TELViTForImageClassification(TELViTConfig(
        **VIT_FIELDS, tel_placement="full", tel_entropy_pooling="token")), image_batch),
}
LEFT_OUT = {("tel-resnet", "image-classification"): "ResNet's BatchNorm pools statistics over the batch (above)"}


def test_every_registered_head_takes_the_whole_batch_step_or_says_why_not():
    covered = {(architecture, task) for architecture, task, _, _ in CASES.values()}
    registered = {(name, task) for name, entry in ARCHITECTURES.items() for task in entry.heads}
    assert registered == covered | set(LEFT_OUT) and not covered & set(LEFT_OUT)


def one_step_update(model, dataset: Dataset, batch_size: int, accumulation: int, directory) -> torch.Tensor:
    model = copy.deepcopy(model)
    before = torch.cat([parameter.detach().flatten().clone() for parameter in model.parameters()])
    args = TrainingArguments(output_dir=str(directory), per_device_train_batch_size=batch_size,
                             gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=1.0, optim="sgd",
                             lr_scheduler_type="constant", max_grad_norm=0, report_to=[], save_strategy="no",
                             use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=dataset).train()
    return torch.cat([parameter.detach().flatten() for parameter in model.parameters()]) - before


@pytest.mark.parametrize("case", list(CASES))
def test_accumulated_step_is_the_whole_batch_step(case, tmp_path):
    _, _, build, batch = CASES[case]
    torch.manual_seed(0)
    model = build()
    dataset = Dataset.from_dict(batch())
    whole = one_step_update(model, dataset, batch_size=4, accumulation=1, directory=tmp_path)
    accumulated = one_step_update(model, dataset, batch_size=2, accumulation=2, directory=tmp_path)
    assert whole.norm() > 0
    torch.testing.assert_close(accumulated, whole, rtol=1e-4, atol=1e-6 * whole.abs().max().item())
