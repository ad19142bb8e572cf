"""The task table (`training.tasks`): the generated data each task trains on, its metrics, and the recipe's task
coming from the model card, never from the data source."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from energyzoo.training.data import DIGIT_MASK_ID, digit_code_split, sudoku_solutions, sudoku_split
from energyzoo.training.recipe import DATA_SOURCES, recipe_from_dict
from energyzoo.training.tasks import TRAINING_TASKS, training_task

DIGITS = set(range(1, 10))


def is_solved_sudoku(board: torch.Tensor) -> bool:
    grid = board.reshape(9, 9).tolist()
    rows = [set(row) for row in grid]
    columns = [set(column) for column in zip(*grid)]
    boxes = [{grid[r][c] for r in range(br, br + 3) for c in range(bc, bc + 3)} for br in (0, 3, 6) for bc in (0, 3, 6)]
    return all(group == DIGITS for group in rows + columns + boxes)


def test_generated_sudoku_solutions_are_valid_and_varied():
    boards = sudoku_solutions(200, torch.Generator().manual_seed(0))
    assert all(is_solved_sudoku(board) for board in boards)
    assert len({tuple(board.tolist()) for board in boards}) == 200
    # every digit lands in every cell across boards: the symmetries are drawn, not a fixed grid relabelled
    assert all(len(set(column.tolist())) == 9 for column in boards.T)


def test_sudoku_puzzles_blank_cells_with_labels_from_the_solution():
    train_inputs, train_labels, val_inputs, val_labels = sudoku_split(100, (30, 45), 0.2, seed=1)
    assert (len(train_inputs), len(val_inputs)) == (80, 20)
    inputs, labels = torch.cat([train_inputs, val_inputs]), torch.cat([train_labels, val_labels])
    blanks = inputs == 0
    assert torch.equal(blanks, labels != -100)
    givens = (~blanks).sum(-1)
    assert givens.min() >= 30 and givens.max() <= 45 and len(set(givens.tolist())) > 5
    solved = torch.where(blanks, labels + 1, inputs)
    assert all(is_solved_sudoku(board) for board in solved)


def test_digit_codes_mask_on_the_cosine_schedule_and_keep_the_pixels_elsewhere():
    train_inputs, train_labels, val_inputs, val_labels = digit_code_split(0.1, seed=2)
    inputs, labels = torch.cat([train_inputs, val_inputs]), torch.cat([train_labels, val_labels])
    masked = inputs == DIGIT_MASK_ID
    assert torch.equal(masked, labels != -100)
    assert masked.sum(-1).min() >= 1  # ceil(64 cos(pi u / 2)) >= 1
    # E[ratio] of cos(pi u / 2), u ~ U(0, 1), is 2 / pi
    assert abs(masked.float().mean().item() - 2 / np.pi) < 0.03
    images = torch.where(masked, labels, inputs)
    reference = {tuple(image) for image in load_digits().images.reshape(-1, 64).astype(int).tolist()}
    assert {tuple(image.tolist()) for image in images} <= reference
    assert len(images) == len(load_digits().images)


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
    owners = [task for task in TRAINING_TASKS.values() for _ in task.sources]
    assert len(owners) == len(DATA_SOURCES)


def test_recipe_task_comes_from_the_preset_card_not_from_the_data():
    recipe = recipe_from_dict({"model": {"preset": "tel-vit-tiny"}, "data": {"source": "digits"}})
    assert recipe.task == "image-classification"
    with pytest.raises(ValueError, match=r"recipe data\.source must be one of \['digits'\]"):
        recipe_from_dict({"model": {"preset": "tel-vit-tiny"}, "data": {"source": "python-docs"}})
    with pytest.raises(ValueError, match=r"recipe model\.task must be 'image-classification'"):
        recipe_from_dict({"model": {"preset": "tel-vit-tiny", "task": "causal-lm"}, "data": {"source": "digits"}})


def test_a_raw_config_recipe_must_name_its_task():
    config = {"model_type": "tel-vit", "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 32, "image_size": 8, "patch_size": 4, "num_channels": 1, "num_labels": 10}
    with pytest.raises(ValueError, match=r"recipe model\.task must be one of"):
        recipe_from_dict({"model": {"config": config}, "data": {"source": "digits"}})
    recipe = recipe_from_dict({"model": {"config": config, "task": "image-classification"},
                               "data": {"source": "digits"}})
    assert recipe.task == "image-classification"
