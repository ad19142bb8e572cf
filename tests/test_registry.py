"""The registry is the one place an architecture is declared: a walk over it checks that every declared class is
registered with its Auto class, covered by a contract tester, and exportable as a folder of its own family's files.
"""

import json

import pytest
import torch
import zoo
from contract import ModelContract
from transformers import AutoConfig, AutoModel

from energyzoo.bench.table import WORKLOADS
from energyzoo.export import export_model
from energyzoo.export.hub_folder import render_card
from energyzoo.measured import measured_ledger, measured_speed
from energyzoo.presets import config_from_preset, preset_card, preset_names
from energyzoo.registry import ARCHITECTURES, TASKS, architecture
from energyzoo.reproduce.experiments import EXPERIMENTS
from energyzoo.reproduce.ledger_tables import NO_EXPERIMENT

TESTERS = zoo.TESTERS


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_every_declared_class_is_registered_with_its_auto_class(model_type):
    entry = ARCHITECTURES[model_type]
    assert entry.config_class.model_type == model_type
    assert AutoConfig.for_model(model_type).__class__ is entry.config_class
    assert AutoModel._model_mapping[entry.config_class] is entry.base_model
    for task, head in entry.heads.items():
        assert TASKS[task].auto_class._model_mapping[entry.config_class] is head
        assert head.config_class is entry.config_class


@pytest.mark.parametrize("task", sorted(TASKS))
def test_each_task_row_says_what_transformers_and_the_heads_say(task):
    """A task's row against transformers (its table of the task's model classes is the one its Auto class reads) and
    against every registered head of the task (the input it reads, the config field counting its label values)."""
    from transformers.models.auto import modeling_auto

    row = TASKS[task]
    assert getattr(modeling_auto, row.transformers_mapping) is row.auto_class._model_mapping._model_mapping
    heads = [(entry, entry.heads[task]) for entry in ARCHITECTURES.values() if task in entry.heads]
    assert heads, f"no architecture has a {task} head"
    for entry, head in heads:
        assert head.main_input_name == row.main_input
        assert isinstance(getattr(entry.config_class(), row.label_classes), int)
    assert row.labels in ("next-token", "sequence", "token", "masked")


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_each_tiny_preset_builds_its_architectures_main_head_small_enough_to_train_in_a_test(model_type):
    entry = ARCHITECTURES[model_type]
    task, main_head = next(iter(entry.heads.items()))
    assert type(config_from_preset(entry.tiny_preset)) is entry.config_class
    assert preset_card(entry.tiny_preset).get("task", task) == task
    with torch.device("meta"):  # counted without memory
        size = sum(p.numel() for p in main_head(config_from_preset(entry.tiny_preset)).parameters())
    assert size < 2_000_000


def test_every_declared_head_and_fem_prior_is_covered_by_a_contract_tester():
    assert zoo.missing_coverage(TESTERS) == []
    assert all(isinstance(tester, ModelContract) for tester in TESTERS)


def test_unknown_architectures_are_refused_by_name():
    with pytest.raises(ValueError, match="'gpt2' is not a zoo architecture"):
        architecture("gpt2")


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_every_bench_preset_is_the_architecture_and_names_a_baseline(model_type):
    entry = ARCHITECTURES[model_type].bench
    if entry is None:
        return
    baselines = {entry.baseline or preset_card(preset)["baseline"] for preset in entry.presets}
    assert len(baselines) == 1 and baselines <= set(preset_names())  # one paired run against one baseline
    if entry.baseline is not None:  # the entry's baseline is that of the presets whose cards name one
        assert {preset_card(preset).get("baseline", entry.baseline) for preset in entry.presets} == baselines
    for preset in entry.presets:
        assert type(config_from_preset(preset)) is ARCHITECTURES[model_type].config_class
    assert set(entry.workloads) <= set(WORKLOADS)
    assert all({own, reference} <= set(entry.presets) for own, reference in entry.contrasts)
    decodes = [workload for workload in entry.workloads if WORKLOADS[workload].language_models]
    assert not decodes or preset_card(entry.presets[0])["task"] == "causal-lm"


def test_the_shipped_bench_results_cover_every_bench_entry_as_declared():
    """measured/bench.json (the documents' and the cards' speed rows) was measured with the registry's entries."""
    measured = {tuple(result["presets"]): result for result in measured_speed()}
    for model_type, architecture_entry in ARCHITECTURES.items():
        entry = architecture_entry.bench
        if entry is None:  # not benched yet
            continue
        result = measured[entry.presets]
        assert result["baseline"] == preset_card(entry.presets[0])["baseline"], model_type
        assert {row["workload"] for row in result["rows"]} == set(entry.workloads), model_type


@pytest.mark.parametrize("tester", zoo.MAIN_HEADS, ids=zoo.name_of)
def test_export_writes_a_full_auto_map_over_the_familys_files_only(tester, tmp_path):
    """The exported folder's auto_map names every declared class, each in a modeling file of the folder; the
    folder holds the architecture's family files and the shared ones, no other family's; its card renders."""
    model = tester.build()
    folder = export_model(model, tmp_path / "export")
    entry = ARCHITECTURES[tester.model_type]
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    declared = {entry.config_class, entry.base_model, *entry.heads.values()}
    assert {target.split(".")[1] for target in auto_map.values()} == {cls.__name__ for cls in declared}
    files = {path.stem for path in folder.glob("*.py")}
    assert {target.split(".")[0] for target in auto_map.values()} <= files
    own = ARCHITECTURES[tester.model_type].family
    others = {entry.family for entry in ARCHITECTURES.values()} - {own}
    assert not [name for name in files if any(name.startswith(f"{other}_") or name.endswith(f"_{other}")
                                               for other in others)], files
    assert f"modeling_{own}" in files and f"configuration_{own}" in files
    card = render_card(model, tmp_path / "export", next(iter(entry.heads)))
    assert card.data.tags == ["energyzoo", tester.model_type, "custom_code"]
    # the family's reproductions, rendered from the shipped ledger: every claim row, not prose written by hand
    shipped = measured_ledger()["experiments"]
    rows = [record["row"] for name, experiment in EXPERIMENTS.items() if experiment.family == entry.family
            for record in shipped[name]["verdicts"]]
    assert all(row in card.text for row in rows) and (rows or NO_EXPERIMENT in card.text)
    assert card.data.pipeline_tag is None  # no tokenizer or image processor in the folder for a pipeline to read
