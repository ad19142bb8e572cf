"""The task table (`training.tasks`): the generated data each task trains on, its metrics, and the recipe's task
coming from the model card, never from the data source."""

import functools
import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from sklearn.datasets import load_digits

from energyzoo.data.digits import DIGIT_MASK_ID, digit_code_split, masked_codes
from energyzoo.data.image_tokenizer import (
    DIGIT_PATCH_CODES,
    digit_patch_split,
    digit_patch_tokenizer,
    reconstruction_metrics,
)
from energyzoo.data.sudoku import count_solutions, sudoku_solutions, sudoku_split
from energyzoo.data.text import pack_into_blocks, python_docs_corpus, train_bpe_tokenizer
from energyzoo.training.recipe import load_recipe
from energyzoo.training.tasks import TRAINING_TASKS, training_task


def is_solved_sudoku(board: torch.Tensor, box: int = 3) -> bool:
    side = box * box
    grid = board.reshape(side, side).tolist()
    digits = set(range(1, side + 1))
    rows = [set(row) for row in grid]
    columns = [set(column) for column in zip(*grid)]
    boxes = [{grid[r][c] for r in range(br, br + box) for c in range(bc, bc + box)}
             for br in range(0, side, box) for bc in range(0, side, box)]
    return all(group == digits for group in rows + columns + boxes)


@functools.cache
def all_4x4_grids() -> list[tuple[int, ...]]:
    """Every solved 4x4 board, enumerated from rows that are permutations (an independent list: 288 of them)."""
    rows = list(itertools.permutations(range(1, 5)))
    return [sum(grid, ()) for grid in itertools.product(rows, repeat=4)
            if is_solved_sudoku(torch.tensor(sum(grid, ())), 2)]


def completions_4x4(board: list[int]) -> int:
    return sum(all(given in (0, digit) for given, digit in zip(board, grid)) for grid in all_4x4_grids())


@pytest.mark.parametrize("box", [2, 3])
def test_generated_sudoku_solutions_are_valid_and_varied(box):
    boards = sudoku_solutions(200, torch.Generator().manual_seed(0), box)
    assert all(is_solved_sudoku(board, box) for board in boards)
    distinct = len({tuple(board.tolist()) for board in boards})
    assert distinct == 200 if box == 3 else distinct > 100  # 4x4 has only 288 grids: draws collide
    # every digit lands in every cell across boards: the symmetries are drawn, not a fixed grid relabelled
    assert all(len(set(column.tolist())) == box * box for column in boards.T)


@pytest.mark.parametrize("box,givens", [(2, (4, 6)), (3, (28, 36))])
def test_sudoku_puzzles_have_unique_solutions_and_labels_from_them(box, givens):
    train_inputs, train_labels, val_inputs, val_labels = sudoku_split(40, givens, 0.25, seed=1, box=box)
    assert (len(train_inputs), len(val_inputs)) == (30, 10)
    inputs, labels = torch.cat([train_inputs, val_inputs]), torch.cat([train_labels, val_labels])
    blanks = inputs == 0
    assert torch.equal(blanks, labels != -100)
    kept = (~blanks).sum(-1)
    assert kept.min() >= givens[0] and len(set(kept.tolist())) > 1
    solved = torch.where(blanks, labels + 1, inputs)
    assert all(is_solved_sudoku(board, box) for board in solved)
    if box == 2:  # 4x4: check uniqueness by enumerating every completion
        assert all(completions_4x4(board.tolist()) == 1 for board in inputs[:10])
    assert all(count_solutions(board.tolist(), box) == 1 for board in inputs)


def test_solution_counter_finds_several_solutions_and_contradictions():
    empty = [0] * 16
    assert count_solutions(empty, 2, limit=1000) == len(all_4x4_grids()) == 288
    assert count_solutions([1, 1] + [0] * 14, 2) == 0


def test_digit_codes_are_masked_afresh_per_batch_on_the_cosine_schedule_and_keep_the_pixels_elsewhere():
    train_codes, val_inputs, val_labels, remask = digit_code_split(0.1, seed=2)
    reference = {tuple(image) for image in load_digits().images.reshape(-1, 64).astype(int).tolist()}
    assert {tuple(image.tolist()) for image in train_codes} <= reference  # unmasked: masks come per batch
    assert len(train_codes) + len(val_inputs) == len(load_digits().images)
    val_masked = val_inputs == DIGIT_MASK_ID
    assert torch.equal(val_masked, val_labels != -100) and val_masked.sum(-1).min() >= 1
    assert len(val_masked.sum(-1).unique()) > 10  # a fixed evaluation set, ratios drawn per example
    batch = train_codes[:32]
    fractions = []
    for step in range(400):
        inputs, labels = remask(step, batch)
        masked = inputs == DIGIT_MASK_ID
        assert torch.equal(masked, labels != -100)
        assert torch.equal(torch.where(masked, labels, inputs), batch)
        assert len(masked.sum(-1).unique()) == 1 and masked.sum() >= 32  # one ratio per batch, ceil(...) >= 1
        fractions.append(masked.float().mean().item())
    assert abs(sum(fractions) / len(fractions) - 2 / np.pi) < 0.03  # E[cos(pi u / 2)], u ~ U(0, 1)
    assert torch.equal(remask(7, batch)[0], remask(7, batch)[0])  # a pure function of the step (resumable)
    assert not torch.equal(remask(7, batch)[0], remask(8, batch)[0])


def test_training_batches_of_masked_modelling_are_remasked_per_step_and_agree_across_micro_batches():
    """Through the training loader's dataset: the micro-batches of one step are slices of one masked global batch
    (one ratio: equal masked counts under the cosine schedule), and an example seen again is masked anew."""
    from energyzoo.training.schedule import ScheduledExamples
    from energyzoo.training.tasks import _masked_modelling_data

    data = _masked_modelling_data(*digit_code_split(0.1, seed=2))
    examples = ScheduledExamples(data, batch_size=8, steps=len(data.train_inputs), seed=0)
    first, second = examples.__getitems__(list(range(4))), examples.__getitems__(list(range(4, 8)))
    counts = torch.cat([(first[0] == DIGIT_MASK_ID).sum(-1), (second[0] == DIGIT_MASK_ID).sum(-1)])
    assert len(counts.unique()) == 1
    again = ScheduledExamples(data, batch_size=8, steps=len(data.train_inputs), seed=0).__getitems__(list(range(4)))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    epoch = len(data.train_inputs) // 8  # steps per pass; the permutation differs, so find example 0's next visit
    seen = examples.schedule.global_batch(0)[0]
    later = next(step for step in range(epoch, 3 * epoch) if seen in examples.schedule.global_batch(step))
    row = int((examples.schedule.global_batch(later) == seen).nonzero()[0])
    inputs, labels = examples.__getitems__([later * 8 + row])
    assert torch.equal(torch.where(labels >= 0, labels, inputs)[0], data.train_inputs[seen])
    assert not torch.equal(inputs[0], first[0][0])


def test_paper_masks_draw_a_ratio_below_0_4_and_mask_cells_independently():
    """hyperset.txt D.4: ratio ~ U(0, 0.4) per image, Bernoulli per token: mean 0.2, per-image counts spread like
    a binomial mixture (some images unmasked), never a fixed count."""
    codes = torch.zeros(20000, 16, dtype=torch.long)
    inputs, labels = masked_codes(codes, "bernoulli-0.4", 99, torch.Generator().manual_seed(0))
    masked = inputs == 99
    assert torch.equal(masked, labels != -100)
    assert abs(masked.float().mean().item() - 0.2) < 0.01
    counts = masked.sum(-1)
    # P(no cell masked) = E[(1 - 0.4 u)^16] = (1 - 0.6^17) / (0.4 * 17)
    assert abs((counts == 0).float().mean().item() - (1 - 0.6**17) / 6.8) < 0.01
    assert counts.max() <= 16 and (counts > 12).float().mean() < 0.01


def test_digit_patches_are_kmeans_codes_of_the_training_images():
    codes = digit_patch_split(0.1, seed=3, schedule="cosine")[0]
    tokenizer = digit_patch_tokenizer(0.1, seed=3)
    images = tokenizer.decode(codes, (8, 8))
    original = load_digits().images[torch.randperm(1797, generator=torch.Generator().manual_seed(3))[: len(codes)]]
    assert reconstruction_metrics(original, images)["psnr"] > 20  # a faithful 64-code tokenizer
    assert codes.max() < DIGIT_PATCH_CODES and len(codes.unique()) > 40


def logits_choosing(predictions: torch.Tensor, classes: int) -> SimpleNamespace:
    return SimpleNamespace(logits=torch.nn.functional.one_hot(predictions, classes).float())


def ratio(metric: tuple[torch.Tensor, torch.Tensor]) -> float:
    return float(metric[0]) / float(metric[1])


def test_sudoku_metrics_score_blanks_and_whole_boards():
    labels = torch.full((3, 81), -100)
    labels[:, :4] = torch.tensor([0, 1, 2, 3])
    predictions = labels.clamp(min=0).clone()
    predictions[1, 0] = 8  # one wrong blank on board 1
    predictions[2, 10] = 8  # a wrong given: not scored
    metrics = training_task("token-classification").metrics(logits_choosing(predictions, 9), labels)
    assert ratio(metrics["cell_accuracy"]) == pytest.approx(11 / 12)
    assert ratio(metrics["board_accuracy"]) == pytest.approx(2 / 3)


def test_masked_accuracy_scores_only_masked_cells():
    labels = torch.tensor([[-100, 3, 5, -100], [7, -100, -100, -100]])
    predictions = torch.tensor([[0, 3, 4, 0], [7, 1, 1, 1]])
    metrics = training_task("masked-image-modeling").metrics(logits_choosing(predictions, 17), labels)
    assert ratio(metrics["masked_accuracy"]) == pytest.approx(2 / 3)


def test_every_data_source_belongs_to_exactly_one_task():
    sources = [source for task in TRAINING_TASKS.values() for source in task.sources]
    assert len(sources) == len(set(sources))


def recipe_from_dict(raw: dict, folder):
    """The validated recipe of a recipe file holding ``raw``."""
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_recipe(path)


def test_recipe_task_comes_from_the_preset_card_not_from_the_data(tmp_path):
    recipe = recipe_from_dict({"model": {"preset": "tel-vit-tiny"}, "data": {"source": "digits"}}, tmp_path)
    assert recipe.task == "image-classification"
    with pytest.raises(ValueError, match=r"recipe data\.source must be one of \['digits', 'hf-images'\]"):
        recipe_from_dict({"model": {"preset": "tel-vit-tiny"}, "data": {"source": "python-docs"}}, tmp_path)
    with pytest.raises(ValueError, match=r"recipe model\.task must be 'image-classification'"):
        recipe_from_dict({"model": {"preset": "tel-vit-tiny", "task": "causal-lm"}, "data": {"source": "digits"}},
                         tmp_path)


def test_a_raw_config_recipe_must_name_its_task(tmp_path):
    config = {"model_type": "tel-vit", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 32, "image_size": 8, "patch_size": 4, "num_channels": 1, "num_labels": 10}
    with pytest.raises(ValueError, match=r"recipe model\.task must be one of"):
        recipe_from_dict({"model": {"config": config}, "data": {"source": "digits"}}, tmp_path)
    recipe = recipe_from_dict({"model": {"config": config, "task": "image-classification"},
                               "data": {"source": "digits"}}, tmp_path)
    assert recipe.task == "image-classification"


def test_corpus_split_is_disjoint_and_tokenizer_round_trips():
    train, validation = python_docs_corpus(validation_fraction=0.1)
    assert validation and not set(train) & set(validation)
    tokenizer = train_bpe_tokenizer(train[:20], vocab_size=400)
    text = "def f(x):\n    return x ** 2  # ünïcode"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    blocks = pack_into_blocks(train[:20], tokenizer, block_size=64)
    assert blocks.shape[1] == 64 and (blocks == tokenizer.eos_token_id).any()
