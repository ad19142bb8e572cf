"""fem.txt's reproductions: the MAD task definitions (checked against what each task must satisfy, read back from
the generated tokens), the MAD ladder's arms and verdicts, and the language-modelling comparison's verdicts."""

import numpy as np
import pytest
import torch

from energyzoo.data.mad import IGNORE, TASKS, mad_split, memorization_map
from energyzoo.reproduce.fem_mad import ARMS, FULL, build, verdicts
from energyzoo.reproduce.fem_mad import Settings as MadSettings
from energyzoo.reproduce.fem_mad import run as run_mad


def _scored(targets: torch.Tensor) -> list[int]:
    return (targets != IGNORE).nonzero().flatten().tolist()


@pytest.mark.parametrize("name", ["in_context_recall", "noisy_recall"])
def test_recall_scores_exactly_the_values_of_keys_seen_before_and_they_are_those_values(name):
    task = TASKS[name].shortened(64)
    inputs, targets = mad_split(task, 50, seed=3, training=False)
    train_inputs, train_targets = mad_split(task, 50, seed=3, training=True)
    assert torch.equal(train_inputs, inputs) and torch.equal(train_targets[:, :-1], inputs[:, 1:])  # next token
    keys = (task.vocab_size - task.noise_vocab_size) // 2
    noise_pairs = 0
    for row, target in zip(inputs.tolist(), targets):
        expected = {}
        bound = {}
        for position in range(0, len(row) - 1, 2):
            key, value = row[position], row[position + 1]
            if key >= 2 * keys:  # a noise pair: both tokens noise, nothing scored
                assert value >= 2 * keys
                noise_pairs += 1
                continue
            assert key < keys <= value < 2 * keys
            if key in bound:
                assert bound[key] == value  # one value per key within a sequence
                expected[position] = value
            bound[key] = value
        last_key = row[-1]
        assert last_key in bound  # the final pair probes a key seen before
        expected[len(row) - 1] = bound[last_key]
        assert {p: target[p].item() for p in _scored(target)} == expected
    assert (noise_pairs > 0) == (task.frac_noise > 0)


def test_fuzzy_recall_values_follow_earlier_occurrences_of_their_three_token_keys():
    task = TASKS["fuzzy_recall"].shortened(96)
    pad = task.vocab_size - 1
    inputs, targets = mad_split(task, 40, seed=1, training=False)
    for row, target in zip(inputs.tolist(), targets.tolist()):
        tokens = row + [target[-1]]
        start = next(index for index, token in enumerate(tokens) if token != pad)
        assert all(token == pad for token in tokens[:start])
        scored = [p for p, value in enumerate(target) if value != IGNORE]
        assert scored and all(7 <= target[p] < 15 for p in scored)  # values: the upper half
        # the last scored run is the probe's value; the three tokens before it are its key, seen earlier
        run_start = scored[-1]
        while run_start - 1 in scored:
            run_start -= 1
        key = tokens[run_start - 2:run_start + 1]
        value = [target[p] for p in range(run_start, scored[-1] + 1)]
        assert all(token < 7 for token in key)
        earlier = [i for i in range(start, run_start - 2) if tokens[i:i + 3] == key]
        assert earlier and tokens[earlier[0] + 3:earlier[0] + 3 + len(value)] == value


def test_memorize_uses_one_fixed_map_in_training_and_test_and_selective_copy_copies_in_order():
    task = TASKS["memorize"]
    mapping = memorization_map(task)
    assert len(mapping) == 127 and len(set(mapping.values())) == 127
    for split in (mad_split(task, 8, seed=0, training=True), mad_split(task, 8, seed=9, training=False)):
        inputs, targets = split
        assert (inputs[:, 1::2] == task.vocab_size - 1).all() and (targets[:, ::2] == IGNORE).all()
        assert [mapping[key] for key in inputs[:, ::2].flatten().tolist()] == targets[:, 1::2].flatten().tolist()
    task = TASKS["selective_copy"].shortened(48)
    inputs, targets = mad_split(task, 20, seed=0, training=False)
    blank, copy_token = task.vocab_size - 2, task.vocab_size - 1
    for row, target in zip(inputs.tolist(), targets.tolist()):
        marker = row.index(copy_token)
        assert marker == task.seq_len - task.copies - 1 and row[marker + 1:] == [blank] * task.copies
        assert [t for t in target if t != IGNORE] == [token for token in row[:marker] if token != blank]
        assert target[:marker + 1] == [IGNORE] * (marker + 1)
    inputs, targets = mad_split(TASKS["compress"], 4, seed=0, training=False)
    assert torch.equal(inputs, targets) and (inputs[:, -1] == 15).all() and (inputs[:, :-1] < 15).all()
    with pytest.raises(ValueError, match="selective_copy copies 16 tokens: its length must be > 33"):
        TASKS["selective_copy"].shortened(32)


def test_the_ladders_arms_switch_on_their_letters_and_softmax_is_a_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = MadSettings(hidden_size=32, heads=2)
    task = TASKS["in_context_recall"].shortened(16)
    for arm in ARMS:
        config = build(arm, task, settings).model.config
        switched = {letter for letter, on in zip("CLTG", (config.use_time_decay, config.use_lse,
                                                          config.use_temperature_gate, config.use_outer_gate)) if on}
        assert switched == (set() if arm == "softmax" else set(arm))
    torch.manual_seed(0)
    softmax = build("softmax", task, settings)
    llama = LlamaForCausalLM(LlamaConfig(**{key: getattr(softmax.model.config, key) for key in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
        "max_position_embeddings", "tie_word_embeddings", "rms_norm_eps", "rope_parameters")}))
    llama.load_state_dict(softmax.model.state_dict())
    ids = torch.randint(0, task.vocab_size, (2, 15))
    torch.testing.assert_close(softmax(ids), llama(input_ids=ids).logits)
    compressor = build("CLTG", TASKS["compress"], settings)
    ids = torch.randint(0, 15, (2, 32))
    changed = ids.clone()
    changed[:, 0] = (changed[:, 0] + 1) % 15
    with torch.no_grad():
        difference = (compressor(ids) - compressor(changed)).abs().amax(dim=-1)
    assert (difference > 1e-6).all()  # the first token reaches every position's reconstruction via the last state


def _rows(task: str, arm: str, accuracies: list[float]) -> list[dict]:
    return [{"task": task, "arm": arm, "seed": seed, "accuracy": value} for seed, value in enumerate(accuracies)]


def _five(level: float, jitter: tuple = (0.0, 0.004, -0.004, 0.002, -0.002)) -> list[float]:
    return [level + offset for offset in jitter]


OTHER_JITTER = (0.001, 0.003, -0.002, 0.0, -0.003)


def test_mad_verdicts_on_constructed_accuracies():
    settings = MadSettings(tasks=["memorize", "selective_copy", "in_context_recall"], seeds=[0, 1, 2, 3, 4])
    rows = (_rows("memorize", "softmax", _five(0.80)) + _rows("memorize", FULL, _five(0.798, OTHER_JITTER))
            + _rows("selective_copy", "softmax", _five(0.90)) + _rows("selective_copy", FULL, _five(0.95, OTHER_JITTER))
            + _rows("in_context_recall", "softmax", _five(0.32))
            + _rows("in_context_recall", FULL, _five(0.33, OTHER_JITTER)))
    for arm, jitter in (("C", OTHER_JITTER[::-1]), ("CL", OTHER_JITTER), ("CLT", (0.0, 0.004, -0.004, 0.002, -0.002))):
        rows += sum((_rows(task, arm, _five(0.7, jitter)) for task in settings.tasks), [])
    records = verdicts(rows, settings)
    assert [(record.get("task"), record["verdict"]) for record in records] == [
        ("memorize", "reproduced"),  # within 1 point of softmax (Table 1: 85.9 vs 85.7)
        ("selective_copy", "reproduced"),  # +5 points against half Table 1's 4.2
        ("in_context_recall", "regime differs"),  # softmax at 32 % where Table 1 has 99.9 %
        ("compress", "needs a GPU"), ("fuzzy_recall", "needs a GPU"),  # the CPU setting leaves them out
        *[(None, "needs a GPU")] * 4]  # Table 1's averages: its tasks at MAD's budget
    assert records[5]["seeds"] == 5 and "Table 1's tasks (but memorize) at MAD's budget" in records[5]["reason"]
    assert records[1]["claim"]["effect"] == pytest.approx(0.021) and "the paper's at 0.951" not in records[1]["reason"]
    assert "the paper's at 0.999" in records[2]["reason"]
    # the ladder's mean leaves memorize out (every Table 1 row has it at 85.4-85.9; ours sits at the ceiling)
    assert records[5]["arm"][0] == pytest.approx(np.mean(_five(0.95, OTHER_JITTER) + _five(0.33, OTHER_JITTER)))
    softmax_mean = (44.3 + 24.5 + 99.9 + 98.5 + 95.1) / 5  # Table 1's softmax row without memorize, by hand
    assert records[5]["claim"]["paper_baseline"] == pytest.approx(softmax_mean / 100, abs=1e-4)
    assert records[5]["claim"]["effect"] == pytest.approx(((53.1 + 43.1 + 99.9 + 99.9 + 99.3) / 5 - softmax_mean) / 200,
                                                          abs=1e-4)
    assert records[4]["arm"] is None and "--paper-scale" in records[4]["reason"]


def test_the_mad_ladder_is_judged_on_table_1s_tasks_at_mads_budget():
    from energyzoo.reproduce.experiments import EXPERIMENTS
    from energyzoo.training.recipe import typed_settings

    settings = typed_settings(MadSettings, list(EXPERIMENTS["fem-mad"].paper_scale))
    rows = []
    # Table 1 without memorize: softmax 72.46, +C 74.50, +C,L 77.42, +C,L,T 78.12, FEM-SM 79.06 (steps 6.6, 2.04,
    # 2.92, 0.7: the effects are half of them). Here the full model +6 points, +C +2, +L +3, +T flat
    for task in TASKS:
        rows += _rows(task, "softmax", _five(0.725)) + _rows(task, FULL, _five(0.785, OTHER_JITTER))
        rows += _rows(task, "C", _five(0.745, OTHER_JITTER[::-1])) + _rows(task, "CL", _five(0.775, OTHER_JITTER))
        rows += _rows(task, "CLT", _five(0.775))
    ladder = verdicts(rows, settings)[len(TASKS):]
    assert [record["verdict"] for record in ladder] == ["reproduced", "reproduced", "reproduced", "not reproduced"]
    assert ladder[1]["difference"] == pytest.approx(np.mean(_five(0.745, OTHER_JITTER[::-1])) - 0.725)


def test_mad_scores_macro_accuracy_on_the_grid_point_best_on_validation():
    from energyzoo.reproduce.fem_mad import accuracy, chosen_on_validation

    class Constant(torch.nn.Module):  # always answers class 1
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(()))

        def forward(self, inputs):
            return torch.nn.functional.one_hot(torch.ones_like(inputs), 4).float() + 0 * self.anchor

    targets = torch.tensor([[1, 1, 1, 1, 1, 1, 2, 3, 0, IGNORE]])  # 6 of 9 scored targets are class 1
    assert accuracy(Constant(), torch.zeros_like(targets), targets) == pytest.approx(1 / 4)  # micro: 6 / 9
    settings = MadSettings(tasks=["memorize"], arms=["softmax", FULL], seeds=[0, 1], learning_rates=[1e-3, 3e-3])
    runs = [{"task": "memorize", "arm": arm, "seed": seed, "learning_rate": rate, "weight_decay": 0.0,
             "validation_accuracy": validation, "accuracy": validation - 0.05}
            for arm, rate, values in (("softmax", 1e-3, (0.5, 0.7)), ("softmax", 3e-3, (0.65, 0.6)),
                                      (FULL, 1e-3, (0.8, 0.8)), (FULL, 3e-3, (0.2, 0.9)))
            for seed, validation in enumerate(values)]
    chosen = chosen_on_validation(runs, settings)
    assert [(row["arm"], row["learning_rate"], row["seed"]) for row in chosen] == [
        ("softmax", 3e-3, 0), ("softmax", 3e-3, 1), (FULL, 1e-3, 0), (FULL, 1e-3, 1)]  # best mean, not best seed


@pytest.mark.slow
def test_a_mad_run_in_two_processes_gives_the_rows_of_one(tmp_path):
    settings = dict(tasks=["memorize", "selective_copy"], arms=["softmax", FULL], seeds=[0], steps=3, batch_size=4,
                    hidden_size=16, heads=2, max_length=40, test_examples=8)
    one = run_mad(MadSettings(**settings), progress=lambda message: None)
    two = run_mad(MadSettings(**settings, workers=2), progress=lambda message: None)
    assert [(row["task"], row["arm"]) for row in one["rows"]] == [
        ("memorize", "softmax"), ("memorize", FULL), ("selective_copy", "softmax"), ("selective_copy", FULL)]
    for first, second in zip(one["rows"], two["rows"]):
        assert first["accuracy"] == pytest.approx(second["accuracy"], abs=1 / 64)
        assert first["train_loss"] == pytest.approx(second["train_loss"], rel=1e-4)
    assert one["verdicts"][0]["verdict"] in ("inconclusive", "regime differs")  # 1 seed, 3 steps: no verdict
    assert {row["learning_rate"] for row in one["grid"]} == set(MadSettings().learning_rates)


def test_the_language_model_verdicts_read_loss_as_lower_is_better():
    from energyzoo.reproduce.fem_lm import language_model_claim
    from energyzoo.reproduce.verdict import judge

    loss = judge(language_model_claim("loss"), [3.0, 3.1, 3.05, 3.02, 3.08], [3.3, 3.35, 3.4, 3.33, 3.37])
    accuracy = judge(language_model_claim("next_token_accuracy"), [0.30, 0.31, 0.305, 0.3, 0.31],
                     [0.33, 0.34, 0.35, 0.34, 0.345])
    assert loss.verdict == "reproduced" and loss.difference == pytest.approx(0.3)
    assert accuracy.verdict == "contradicted at this scale"  # 3.6 points behind: beyond the effect, the other way
    untrained = judge(language_model_claim("loss"), [7.5] * 5, [7.62, 7.615, 7.62, 7.61, 7.625])
    assert untrained.verdict == "regime differs"  # Llama within the effect of log(2048) = 7.62: nothing learned
    assert language_model_claim("loss").primary and not language_model_claim("next_token_accuracy").primary


def test_the_standard_library_corpus_holds_out_validation_and_test_files():
    from energyzoo.data.text import _stdlib_documents, python_stdlib_corpus, python_stdlib_test_documents

    documents = _stdlib_documents()
    train, validation = python_stdlib_corpus(0.1)
    test = python_stdlib_test_documents()
    assert len(train) + len(validation) + len(test) == len(documents) > 400
    assert abs(len(validation) / (len(train) + len(validation)) - 0.1) < 0.01
    # every module file is in exactly one part: the test part is every tenth file by path, the rest split again
    from collections import Counter

    assert Counter(test) == Counter(documents[::10])
    assert Counter(train) + Counter(validation) == Counter(text for index, text in enumerate(documents) if index % 10)
    assert sum(map(len, train)) > 7_000_000  # characters: about 3M tokens, under one epoch at 1,000 x 16 x 128


@pytest.mark.slow
def test_fem_lm_picks_each_arms_learning_rate_on_validation_and_judges_on_the_test_files(tmp_path, monkeypatch):
    from energyzoo.data.text import python_stdlib_test_documents
    from energyzoo.reproduce import fem_lm
    from energyzoo.reproduce.fem_lm import ARMS, Settings, run

    # the selection and the judging, not the corpus: a few files validate and test (the full parts take minutes)
    monkeypatch.setattr(fem_lm, "CORPUS", (*fem_lm.CORPUS[:-1], "data.validation_fraction=0.005"))
    monkeypatch.setattr(fem_lm, "python_stdlib_test_documents", lambda: python_stdlib_test_documents()[:8])
    settings = Settings(seeds=[0, 1], steps=4, evaluations=2, learning_rates=[1e-3, 3e-2], grid_seeds=1)
    report = run(settings, tmp_path, progress=lambda message: None)
    for arm in ARMS:
        grid = report["learning_rate_grid"][arm]
        assert report["learning_rates"][arm] == float(min(grid, key=grid.get))  # the lowest validation loss
        runs = [row for row in report["rows"] if row["arm"] == arm]
        assert [row["seed"] for row in runs] == [0, 1] and {row["learning_rate"] for row in runs} == {
            report["learning_rates"][arm]}
        assert [point["step"] for point in report["validation_curves"][arm]] == [2, 4]
        assert all(row["loss"] != row["validation_loss"] for row in runs)  # the test files, not the validation ones
    # the grid trained both rates with the first seed: their folders exist
    assert (tmp_path / "fem-lr0.03-s0").is_dir() and (tmp_path / "fem-lr0.001-s0").is_dir()
    assert [record["claim"]["primary"] for record in report["verdicts"]] == [True, False]
