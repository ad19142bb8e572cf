"""Empty and degenerate input, for every model class of the zoo: no tokens, an empty batch, ids outside the vocabulary,
masks that are not 0/1 or do not fit, images of the wrong channels or size, labels outside the classes. Each gets a
`ValueError` naming the input before any kernel runs (the defects: a RecursionError ~990 frames deep in FEM's
conditioner, reshape and index errors from torch). A row the attention mask zeroes whole is transformers' documented
case: finite outputs, the other rows' outputs unchanged."""

import pytest
import torch
import zoo

from energyzoo.registry import ARCHITECTURES

TOKEN_MODELS = zoo.token_testers(zoo.HEADS_AND_PRIORS)
IMAGE_MODELS = zoo.image_testers(zoo.HEADS_AND_PRIORS)
PADDED = zoo.padded_testers(zoo.HEADS_AND_PRIORS)


def model_classes(tester) -> list[type]:
    return [ARCHITECTURES[tester.model_type].base_model, tester.head_class]


def named(testers):
    return pytest.mark.parametrize("tester", testers, ids=lambda tester: type(tester).__name__)


def refused(model, message: str, **inputs) -> None:
    with torch.no_grad(), pytest.raises(ValueError, match=message) as raised:
        model(**inputs)
    assert "\n" not in str(raised.value)


@named(TOKEN_MODELS)
def test_token_inputs_without_tokens_or_outside_the_vocabulary_are_refused(tester):
    for model_class in model_classes(tester):
        model = tester.build(model_class)
        vocabulary = model.get_input_embeddings().num_embeddings
        no_tokens = "input_ids must be at least one sequence of at least one token"
        refused(model, no_tokens, input_ids=torch.zeros(1, 0, dtype=torch.long))
        refused(model, no_tokens, input_ids=torch.zeros(0, 5, dtype=torch.long))
        outside = rf"input_ids must be ids in \[0, vocab_size={vocabulary}\)"
        refused(model, outside, input_ids=torch.full((1, 4), vocabulary))
        refused(model, outside + r", got ids in \[-1, 3\]", input_ids=torch.tensor([[3, -1, 3]]))
        refused(model, "input_ids must be a \\(batch, sequence\\) tensor of torch.long or torch.int ids",
                input_ids=torch.ones(1, 4))
        refused(model, "input_ids must be a \\(batch, sequence\\) tensor", input_ids=torch.ones(4, dtype=torch.long))


@named(PADDED)
def test_masks_must_hold_zeros_and_ones_and_cover_the_tokens(tester):
    model = tester.build()
    ids = tester.random_ids(model.config, 6, seed=1).repeat(2, 1)
    refused(model, "attention_mask must be 0s and 1s", input_ids=ids, attention_mask=torch.full_like(ids, 2))
    shape = r"attention_mask must be of shape \(2, 6\): the cached and the 6 new tokens"
    refused(model, shape, input_ids=ids, attention_mask=torch.ones(2, 4, dtype=torch.long))
    refused(model, shape, input_ids=ids, attention_mask=torch.ones(2, 8, dtype=torch.long))  # no cache to cover
    refused(model, "attention_mask must be 2-D", input_ids=ids, attention_mask=torch.ones(12, dtype=torch.long))


@named(PADDED)
def test_a_row_of_padding_alone_gives_finite_outputs_and_leaves_the_other_rows_alone(tester):
    """Eval outputs, and a training loss and gradients with the padded row's labels ignored, are finite; the real
    row's outputs are those it has alone."""
    model = tester.build()
    sequence = tester.random_ids(model.config, 7, seed=2)
    ids = torch.cat([tester.random_ids(model.config, 7, seed=3), sequence])
    mask = torch.tensor([[0] * 7, [1] * 7])
    with torch.no_grad():
        batched = model(input_ids=ids, attention_mask=mask).logits
        alone = model(input_ids=sequence).logits
    assert torch.isfinite(batched).all()
    torch.testing.assert_close(batched[1], alone[0], rtol=1e-5, atol=1e-5)
    model.train()
    labels = tester.labels_for(ids, model.config, torch.Generator().manual_seed(4))
    if tester.causal_lm:
        labels[0] = -100  # nothing to predict on padding (a classifier's row keeps its class)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@named(TOKEN_MODELS)
def test_labels_outside_the_classes_are_refused(tester):
    model = tester.build()
    inputs = tester.make_inputs(model.config)
    classes = model.config.vocab_size if tester.causal_lm else model(**tester.without_labels(inputs)).logits.shape[-1]
    labels = inputs["labels"].clone()
    labels.view(-1)[0] = classes
    refused(model, rf"labels must be in \[0, {classes}\)( or -100 \(ignored\))?, got labels in \[",
            **{**inputs, "labels": labels})
    if not tester.causal_lm and labels.dim() == 1:  # one class per example: -100 would leave a mean over nothing
        refused(model, rf"labels must be in \[0, {classes}\), got labels in \[-100, ",
                **{**inputs, "labels": torch.full_like(labels, -100)})


@named([tester for tester in TOKEN_MODELS if tester.causal_lm])
def test_generating_from_an_empty_prompt_is_refused(tester):
    model = tester.build()
    with pytest.raises(ValueError, match="input_ids must be at least one sequence of at least one token"):
        model.generate(input_ids=torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2, do_sample=False,
                       pad_token_id=model.config.pad_token_id)


def test_hyperset_refuses_a_padding_mask_it_would_ignore():
    tester = zoo.tester_for("hyperset", "token-classification")
    model = tester.build()
    inputs = tester.without_labels(tester.make_inputs(model.config))
    mask = torch.ones_like(inputs["input_ids"])
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs, attention_mask=mask).logits, model(**inputs).logits)
    mask[0, -1] = 0
    refused(model, "attention_mask must be None or all ones \\(Hyper-SET has no padding mask", **inputs,
            attention_mask=mask)


@named(IMAGE_MODELS)
def test_images_of_no_batch_other_channels_or_another_size_are_refused(tester):
    for model_class in model_classes(tester):
        model = tester.build(model_class)
        pixels = tester.make_inputs(model.config)["pixel_values"]
        refused(model, "pixel_values must be a float tensor of shape", pixel_values=pixels[:0])
        refused(model, "pixel_values must be a float tensor of shape", pixel_values=pixels[:, :1].repeat(1, 4, 1, 1))
        refused(model, "pixel_values must be a float tensor of shape", pixel_values=pixels[0])
        refused(model, "pixel_values must be a float tensor of shape", pixel_values=pixels.long())
        if not tester.takes_any_image_size:
            refused(model, "pixel_values must be a float tensor of shape", pixel_values=pixels[..., :-1, :-1])
    model = tester.build()
    inputs = tester.make_inputs(model.config)
    refused(model, r"labels must be in \[0, 3\)", pixel_values=inputs["pixel_values"],
            labels=torch.full_like(inputs["labels"], 3))


def test_every_registered_head_and_prior_is_checked():
    assert zoo.missing_coverage(TOKEN_MODELS + IMAGE_MODELS) == []
