"""`Trainer` with gradient accumulation takes the step of the whole batch, for every zoo head with a loss.

The reference is the same `Trainer` on the whole batch at once (no accumulation): one SGD step of 2 x 2 accumulated
micro-batches must move every parameter as one step on the 4 examples does. Heads whose loss is a per-batch mean
(eq. 2's regularisers, eq. 18's energy, the classifiers) declare ``accepts_loss_kwargs = False``, so `Trainer`
averages the micro-batches; causal LMs that normalise by ``num_items_in_batch`` get it from `Trainer`, which
keeps the step exact even when the micro-batches hold different numbers of labelled tokens.

The cases are the zoo's heads (`zoo.ONE_PER_HEAD`), each built by its contract tester with its
``trainer_overrides`` on a batch of four of its inputs; where the loss takes ``num_items_in_batch``, the first
micro-batch holds fewer labelled tokens than the second. Left out by design, with the reason in the tester's
``accumulation_left_out``: a training forward that pools statistics over the batch (ResNet's BatchNorm) gives each
micro-batch its own statistics; TEL's default "batch" entropy pooling (tel.txt D.4) likewise, so its testers train
with "token" pooling here."""

import copy

import pytest
import torch
import zoo
from datasets import Dataset
from transformers import Trainer, TrainingArguments

CASES = [tester for tester in zoo.ONE_PER_HEAD if tester.accumulation_left_out is None]


def test_every_registered_head_takes_the_whole_batch_step_or_says_why_not():
    assert zoo.missing_coverage(zoo.ONE_PER_HEAD, priors=False) == []
    left_out = [tester for tester in zoo.ONE_PER_HEAD if tester not in CASES]
    assert all(isinstance(tester.accumulation_left_out, str) and tester.accumulation_left_out for tester in left_out)


def trainer_batch(tester, model) -> dict:
    """Four rows of the tester's inputs, as lists. Where the loss takes `Trainer`'s ``num_items_in_batch`` (a causal
    LM that accepts loss kwargs), the first row has half its labels masked, so the two micro-batches hold different
    numbers of labelled tokens; where it is a per-batch mean, rows (a, b, b, a), so that both hold as many."""
    if tester.causal_lm and getattr(model, "accepts_loss_kwargs", True):
        inputs = tester.make_inputs(model.config, batch_size=4, seed=1)
        inputs["labels"] = inputs["labels"].clone()
        inputs["labels"][0, : inputs["labels"].shape[1] // 2] = -100
    else:
        inputs = {name: value[[0, 1, 1, 0]] for name, value in tester.make_inputs(model.config, seed=1).items()}
    return {name: value.tolist() for name, value in inputs.items()}


def one_step_update(model, dataset: Dataset, batch_size: int, accumulation: int, directory) -> torch.Tensor:
    model = copy.deepcopy(model)
    before = torch.cat([parameter.detach().flatten().clone() for parameter in model.parameters()])
    args = TrainingArguments(output_dir=str(directory), per_device_train_batch_size=batch_size,
                             gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=1.0, optim="sgd",
                             lr_scheduler_type="constant", max_grad_norm=0, report_to=[], save_strategy="no",
                             use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=dataset).train()
    return torch.cat([parameter.detach().flatten() for parameter in model.parameters()]) - before


@pytest.mark.parametrize("tester", CASES, ids=zoo.name_of)
def test_accumulated_step_is_the_whole_batch_step(tester, tmp_path):
    model = tester.build(**tester.trainer_overrides)
    dataset = Dataset.from_dict(trainer_batch(tester, model))
    whole = one_step_update(model, dataset, batch_size=4, accumulation=1, directory=tmp_path)
    accumulated = one_step_update(model, dataset, batch_size=2, accumulation=2, directory=tmp_path)
    assert whole.norm() > 0
    torch.testing.assert_close(accumulated, whole, rtol=1e-4, atol=1e-6 * whole.abs().max().item())
