"""Exports are honest: a folder declares a pipeline only where that pipeline runs on it, the export never rewrites its
input nor mixes with unrelated files, and `energyzoo eval` says in one line that it scores causal LMs only."""

import hashlib
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, pipeline

from energyzoo import model_from_preset
from energyzoo.cli import main
from energyzoo.data.text import python_docs_corpus, train_bpe_tokenizer
from energyzoo.export import export_folder


def saved(tmp_path: Path, preset: str, tokenizer=None, **overrides) -> Path:
    folder = tmp_path / preset
    model_from_preset(preset, **overrides).save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def fingerprint(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.mark.parametrize("preset", ["eqt-parity-small", "eer-induction", "hyperset-sudoku-tiny", "hyperset-mim-tiny"])
def test_models_of_token_ids_declare_no_pipeline(preset, tmp_path):
    """Trained on task ids (parity bits, induction symbols, Sudoku digits, visual codes), they ship no tokenizer, so
    no transformers pipeline (nor the Hub widget built on it) can run on them: the card declares none."""
    folder = export_folder(saved(tmp_path, preset), tmp_path / "export")
    assert not (folder / "tokenizer_config.json").exists()
    card = ModelCard.load(folder / "README.md")
    assert card.data.pipeline_tag is None and "energyzoo" in card.data.tags


def test_a_language_model_with_its_tokenizer_declares_the_text_generation_pipeline_that_runs(tmp_path):
    tokenizer = train_bpe_tokenizer(python_docs_corpus()[0][:50], 300)
    model_dir = saved(tmp_path, "fem-lm-tiny", tokenizer, vocab_size=len(tokenizer), hidden_size=32,
                      intermediate_size=64, num_hidden_layers=2)
    folder = export_folder(model_dir, tmp_path / "export")
    card = ModelCard.load(folder / "README.md")
    assert card.data.pipeline_tag == "text-generation"
    generator = pipeline(card.data.pipeline_tag, model=str(folder), trust_remote_code=True)
    text = generator("def f(x):", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    ids = tokenizer("def f(x):", return_tensors="pt").input_ids
    expected = AutoModelForCausalLM.from_pretrained(model_dir).generate(ids, max_new_tokens=4, do_sample=False,
                                                                        pad_token_id=tokenizer.pad_token_id)
    assert text == tokenizer.decode(expected[0], skip_special_tokens=True)


def test_export_never_rewrites_its_input(tmp_path):
    model_dir = saved(tmp_path, "fem-lm-tiny")
    before = fingerprint(model_dir)
    for output in (model_dir, model_dir / "export", tmp_path):
        with pytest.raises(ValueError, match="export writes a folder of its own"):
            export_folder(model_dir, output)
    assert fingerprint(model_dir) == before
    assert main(["export", str(model_dir), str(model_dir)]) == 2
    assert fingerprint(model_dir) == before


def test_export_refuses_a_folder_of_other_files_quietly_and_replaces_an_untouched_earlier_export(tmp_path, caplog):
    model_dir = saved(tmp_path, "fem-lm-tiny")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("not an export")
    (mine / "README.md").write_text("# my notes\n")  # a card without metadata: huggingface_hub would warn of it
    with pytest.raises(ValueError, match=r"mine holds files that are not an energyzoo export \(README.md, notes.txt\)"):
        export_folder(model_dir, mine)
    assert sorted(path.name for path in mine.iterdir()) == ["README.md", "notes.txt"] and not list(tmp_path.glob(".*"))
    assert not [record for record in caplog.records if record.name.startswith("huggingface_hub")], caplog.text
    earlier = export_folder(model_dir, tmp_path / "export")
    caplog.clear()
    export_folder(model_dir, earlier)  # untouched since it was written: replaced, and said so
    assert [record.getMessage() for record in caplog.records] == [f"replacing the earlier export in {earlier}"]
    assert not list(tmp_path.glob(".*"))  # no partial or old folder left beside it


def test_an_export_whose_files_were_edited_is_replaced_only_when_asked(tmp_path):
    model_dir = saved(tmp_path, "fem-lm-tiny")
    earlier = export_folder(model_dir, tmp_path / "export")
    card = (earlier / "README.md").read_text()
    (earlier / "README.md").write_text(card + "\nMy notes on this model.\n")
    (earlier / "eval").mkdir()
    (earlier / "eval" / "stale.json").write_text("{}")
    before = fingerprint(earlier)
    with pytest.raises(ValueError, match=r"export is an earlier export whose files were edited since it was written "
                                         r"\(README.md, eval/stale.json\): export elsewhere, or pass --overwrite"):
        export_folder(model_dir, earlier)
    assert fingerprint(earlier) == before
    export_folder(model_dir, earlier, overwrite=True)  # replaced as a whole, the edits and stale results with it
    assert (earlier / "README.md").read_text() == card and not (earlier / "eval").exists()
    (earlier / "manifest.json").unlink()  # an export that cannot say what it wrote is replaced only when asked
    with pytest.raises(ValueError, match="records no manifest.json, so edits to it cannot be told"):
        export_folder(model_dir, earlier)


def test_eval_refuses_a_folder_that_is_no_causal_language_model_in_one_line(tmp_path, capsys):
    model_dir = saved(tmp_path, "tel-vit-tiny")
    capsys.readouterr()  # the save's progress bar
    assert main(["eval", str(model_dir)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "energyzoo eval runs lm-evaluation-harness, which scores causal language models; " \
                               f"{model_dir} holds TELViTForImageClassification" in lines[0]
    assert not (model_dir / "eval").exists()
