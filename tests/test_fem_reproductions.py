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


def test_mad_verdicts_on_constructed_accuracies():
    settings = MadSettings(tasks=["compress", "memorize"], seeds=[0, 1, 2])
    rows = (_rows("compress", "softmax", [0.40, 0.42, 0.41]) + _rows("compress", FULL, [0.50, 0.52, 0.49])
            + _rows("memorize", "softmax", [0.80, 0.81, 0.79]) + _rows("memorize", FULL, [0.795, 0.805, 0.785]))
    for arm in ("C", "CL", "CLT"):
        rows += _rows("compress", arm, [0.45, 0.46, 0.45]) + _rows("memorize", arm, [0.80, 0.80, 0.80])
    records = verdicts(rows, settings)
    assert [(record.get("task"), record["verdict"]) for record in records] == [
        ("compress", "reproduced"), ("memorize", "reproduced"),  # memorize: within 1 point of softmax
        (None, "reproduced"), (None, "reproduced"), (None, "inconclusive"), (None, "inconclusive")]
    assert records[2]["arm"][0] == pytest.approx(np.mean([0.50, 0.52, 0.49, 0.795, 0.805, 0.785]))
    assert records[3]["claim"]["arm"] == "C" and records[3]["difference"] == pytest.approx(0.065 / 3)
    assert "seeds disagree" not in records[4]["reason"] and "within" in records[4]["reason"]  # CL ties C


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
    assert one["verdicts"][0]["reason"] == "1 seed; a verdict needs >= 3"


def test_the_language_model_verdicts_read_loss_as_lower_is_better():
    from energyzoo.reproduce.fem_lm import language_model_claim
    from energyzoo.reproduce.verdict import judge

    loss = judge(language_model_claim("validation_loss"), [3.0, 3.1, 3.05], [3.3, 3.35, 3.4])
    accuracy = judge(language_model_claim("validation_next_token_accuracy"), [0.30, 0.31, 0.305], [0.33, 0.34, 0.35])
    assert loss.verdict == "reproduced" and loss.difference == pytest.approx(0.3)
    assert accuracy.verdict == "not reproduced"
