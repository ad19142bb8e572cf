"""Hyper-SET's heads as transformers' tools use them: the losses against torch's own (problem types, cells without
labels, MaskGIT's default labels), hidden states selected by index against the full list, and the token
embedding resized."""

import pytest
import torch
import torch.nn.functional as F
from test_hyperset_contract import perturb_hyperset

from energyzoo import (
    HyperSETConfig,
    HyperSETForImageClassification,
    HyperSETForMaskedImageModeling,
    HyperSETForTokenClassification,
)

CODEBOOK, GRID = 16, 16


def build(head, seed: int = 0, **fields):
    """A two-layer, three-iteration model whose step sizes act (`perturb_hyperset`)."""
    torch.manual_seed(seed)
    model = head(HyperSETConfig(hidden_size=32, num_attention_heads=4, intermediate_size=32, num_hidden_layers=2,
                                num_iterations=3, time_embed_dim=16, **fields))
    perturb_hyperset(model, seed)
    return model


def maskgit(**fields):
    return build(HyperSETForMaskedImageModeling, input_type="tokens", vocab_size=CODEBOOK + 1,
                 codebook_size=CODEBOOK, mask_token_id=CODEBOOK, use_cls_token=False,
                 position_embedding_type="sincos2d", max_position_embeddings=GRID, **fields)


def sudoku(**fields):
    return build(HyperSETForTokenClassification, **{
        "input_type": "tokens", "vocab_size": 10, "num_labels": 9, "use_cls_token": False,
        "position_embedding_type": "learned", "max_position_embeddings": GRID, **fields})


def image_classifier(**fields):
    return build(HyperSETForImageClassification, image_size=8, patch_size=2, num_channels=3, **fields)


def test_maskgit_labels_default_to_the_masked_codes_and_no_masked_cell_costs_zero():
    model = maskgit().train()
    codes = torch.randint(0, CODEBOOK, (3, GRID), generator=torch.Generator().manual_seed(1))
    masked = torch.rand(3, GRID, generator=torch.Generator().manual_seed(2)) < 0.4
    out = model(input_ids=codes, bool_masked_pos=masked)
    expected = F.cross_entropy(out.logits[masked].float(), codes[masked])
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert model.classifier.weight.grad.abs().sum() > 0

    nothing = model(input_ids=codes, bool_masked_pos=torch.zeros_like(masked))
    assert nothing.loss.item() == 0.0
    nothing.loss.backward()  # a batch without masked cells is a zero step, not a NaN


def test_token_loss_is_the_mean_over_labelled_cells():
    model = sudoku()
    ids = torch.randint(0, 10, (2, GRID))
    labels = torch.randint(0, 9, (2, GRID)).masked_fill(ids > 4, -100)
    out = model(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.flatten(0, 1), labels.flatten()))
    assert model(input_ids=ids, labels=torch.full_like(labels, -100)).loss.item() == 0.0


@pytest.mark.parametrize("problem_type, num_labels", [("single_label_classification", 3), ("regression", 1),
                                                      ("multi_label_classification", 3)])
def test_image_classification_loss_follows_the_problem_type(problem_type, num_labels):
    model = image_classifier(num_labels=num_labels, problem_type=problem_type)
    pixels = torch.randn(4, 3, 8, 8)
    if problem_type == "single_label_classification":
        labels = torch.randint(0, num_labels, (4,))
    elif problem_type == "regression":
        labels = torch.randn(4)
    else:
        labels = torch.randint(0, 2, (4, num_labels)).float()
    out = model(pixel_values=pixels, labels=labels)
    expected = {"single_label_classification": lambda: F.cross_entropy(out.logits, labels),
                "regression": lambda: F.mse_loss(out.logits.squeeze(-1), labels),
                "multi_label_classification": lambda: F.binary_cross_entropy_with_logits(out.logits, labels)}
    torch.testing.assert_close(out.loss, expected[problem_type]())


def test_hidden_states_selected_by_index_are_the_ones_of_the_full_list():
    """L = 2 layers of R = 3 iterations record 7 states; index -1 is the final state (last_hidden_state), not the
    state after L; indices with another iteration count are refused rather than resolved against R."""
    model = sudoku().eval()
    ids = torch.randint(0, 10, (2, GRID))
    with torch.no_grad():
        full = model.model(input_ids=ids, output_hidden_states=True)
        chosen = model.model(input_ids=ids, output_hidden_states=[1, -1])
    assert len(full.hidden_states) == 7 and len(chosen.hidden_states) == 7
    torch.testing.assert_close(chosen.hidden_states[-1], full.last_hidden_state)
    torch.testing.assert_close(chosen.hidden_states[1], full.hidden_states[1])
    assert all(chosen.hidden_states[i] is None for i in range(2, 6))
    with pytest.raises(ValueError, match="refinement_steps=5, pass output_hidden_states=True"):
        model(input_ids=ids, output_hidden_states=[-1], refinement_steps=5)


def test_resized_token_embedding_keeps_the_old_rows_and_embeds_the_new_ids():
    model = sudoku().eval()
    old = model.get_input_embeddings().weight.detach().clone()
    model.resize_token_embeddings(12)
    assert model.config.vocab_size == 12
    torch.testing.assert_close(model.get_input_embeddings().weight[:10], old)
    ids = torch.tensor([[11] * GRID])
    with torch.no_grad():
        out = model.model(input_ids=ids, output_hidden_states=True)
    expected = model.get_input_embeddings().weight[11] + model.model.embeddings.position_embeddings[0]
    torch.testing.assert_close(out.hidden_states[0][0], expected)
