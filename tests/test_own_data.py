"""A user's own data, end to end: text files, JSONL and image folders train as they are, and every mistake in them (or
in the settings that name them, the Hub out of reach included) is one line, exit code 2, naming the file and the fix,
with nothing left in the way of the corrected command (the corruption sweep's style: one case a row, over every data
source that reads a user's files)."""

import hashlib
import json
import pydoc_data.topics
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image, ImageDraw
from transformers import AutoModelForImageClassification

from energyzoo.cli import main
from energyzoo.data import hub_access
from energyzoo.data.text import language_model_blocks, train_bpe_tokenizer
from energyzoo.modeling.errors import UserError
from energyzoo.training.finetune import finetune_with_trainer
from energyzoo.training.recipe import load_recipe

TINY_LM = ["model.overrides.hidden_size=32", "model.overrides.intermediate_size=64",
           "model.overrides.num_hidden_layers=1", "tokenizer.train_vocab_size=300", "training.steps=2",
           "training.batch_size=2", "training.eval_every=2", "training.warmup_steps=1"]
TINY_IMAGES = ["training.steps=2", "training.batch_size=4", "training.eval_every=2", "training.warmup_steps=1",
               "data.source=hf-images", "data.name=imagefolder"]
TOPICS = [text.strip() for _, text in sorted(pydoc_data.topics.topics.items())]


def paragraphs_file(path: Path, count: int = 40) -> list[str]:
    """A text file of ``count`` paragraphs (help topics with their inner blank lines closed); returns them."""
    paragraphs = [" ".join(topic.split()) for topic in TOPICS[:count]]
    path.write_text("\n\n".join(paragraphs) + "\n")
    return paragraphs


def draw_images(folder: Path, classes: dict[str, int], size: tuple[int, int] = (16, 16), mode: str = "RGB") -> None:
    """``classes[name]`` images of ``size`` per class sub-folder, a shape a class."""
    for shape_index, (name, count) in enumerate(classes.items()):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            image = Image.new(mode, size, "white")
            corner = 1 + index % 4
            box = [corner, corner, corner + size[0] // 2, corner + size[1] // 2]
            (ImageDraw.Draw(image).ellipse if shape_index % 2 == 0 else ImageDraw.Draw(image).rectangle)(
                box, fill="black")
            image.save(folder / name / f"{index}.png")


def answer(capsys, arguments: list[str]) -> tuple[int, str]:
    code = main(arguments)
    return code, capsys.readouterr().err


def one_line(error: str) -> str:
    lines = [line for line in error.strip().splitlines() if not line.startswith("energyzoo: ")]
    assert len(lines) == 1 and lines[0].startswith("energyzoo train: error: "), error
    return lines[0]


def folder_digest(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != ".energyzoo.lock"}


# the mistakes: (case, data files to write, the command's settings, what the line says) -----------------------------
def _text(folder: Path) -> None:
    paragraphs_file(folder / "stories.txt")


def _jsonl(folder: Path, *lines: str) -> None:
    (folder / "stories.jsonl").write_text("".join(line + "\n" for line in lines))


def _images(folder: Path) -> None:
    draw_images(folder / "imgs", {"circles": 4, "squares": 4})


def _broken_image(folder: Path) -> None:
    _images(folder)
    (folder / "imgs/circles/9.png").write_bytes(b"not a png")


def _two_sizes(folder: Path) -> None:
    _images(folder)
    draw_images(folder / "imgs", {"circles": 1}, size=(20, 12))  # 0.png again, of another size


MISTAKES = [
    ("text: a missing file", _text, ["data.source=text", "data.paths=[missing.txt]"],
     "missing.txt: no such file or folder"),
    ("text: a glob that matches nothing", _text, ["data.source=text", "data.paths=[nope/*.txt]"],
     "matches no file"),
    ("text: an empty file", lambda folder: (folder / "empty.txt").write_text("\n \n"),
     ["data.source=text", "data.paths=[empty.txt]"], "empty.txt is empty"),
    ("text: not UTF-8", lambda folder: (folder / "latin.txt").write_bytes("first line\ncaf\xe9".encode("latin-1")),
     ["data.source=text", "data.paths=[latin.txt]"], "latin.txt: not UTF-8 text (byte 0xe9 on line 2)"),
    ("text: a folder without text files", lambda folder: (folder / "notes").mkdir(),
     ["data.source=text", "data.paths=[notes]"], "notes holds no text files (names ending .txt, .md, .text, .rst)"),
    ("text: too short for two blocks", lambda folder: (folder / "short.txt").write_text("a few words only"),
     ["data.source=text", "data.paths=[short.txt]", "data.block_size=64"], "do not fill two blocks"),
    ("jsonl: no such field", lambda folder: _jsonl(folder, '{"id": 1, "content": "a story"}'),
     ["data.source=jsonl", "data.paths=[stories.jsonl]"],
     "stories.jsonl line 1 has no field 'text' (fields: id, content): set data.text_field=content"),
    ("jsonl: a line that is no JSON", lambda folder: _jsonl(folder, '{"text": "fine"}', "", '{"text": oops}'),
     ["data.source=jsonl", "data.paths=[stories.jsonl]"], "stories.jsonl line 3: not JSON"),
    ("jsonl: a line that is no record", lambda folder: _jsonl(folder, '["text"]'),
     ["data.source=jsonl", "data.paths=[stories.jsonl]"], "stories.jsonl line 1: a JSON list"),
    ("jsonl: a field that is no text", lambda folder: _jsonl(folder, '{"text": 3}'),
     ["data.source=jsonl", "data.paths=[stories.jsonl]"], "field 'text' is a int, not text"),
    ("hf: a missing local file", _text, ["data.source=hf", "data.name=json", "data.paths=[gone.jsonl]"],
     "gone.jsonl: no such file or folder"),
    ("hf: a local file that is no JSONL", lambda folder: _jsonl(folder, '{"text": "fine"}', '{"text": oops}'),
     ["data.source=hf", "data.name=json", "data.paths=[stories.jsonl]"], "'json' cannot read them (JSON parse error"),
    ("hf: no such field", lambda folder: _jsonl(folder, '{"id": 1, "content": "a story"}'),
     ["data.source=hf", "data.name=json", "data.paths=[stories.jsonl]"],
     "data.text_field='text' is not a field of data.name='json' (fields: id, content)"),
    ("hf: a Hub id offline", _text, ["data.source=hf", "data.name=someone/corpus"],
     "data.name='someone/corpus' is read from the Hugging Face Hub, which cannot be reached"),
    ("hf-sudoku: a missing local file", _text, ["data.name=json", "data.paths=[puzzles.jsonl]"],
     "puzzles.jsonl: no such file or folder"),
    ("hf-images: a missing folder", _images, ["data.paths=[pictures]"], "pictures: no such file or folder"),
    ("hf-images: one class", lambda folder: draw_images(folder / "imgs", {"circles": 4}), ["data.paths=[imgs]"],
     "has one class (circles): a classifier needs two"),
    ("hf-images: no such image column", _images, ["data.paths=[imgs]", "data.image_column=img"],
     "data.image_column='img' is not a column of the image folder"),
    ("hf-images: no such label column", _images, ["data.paths=[imgs]", "data.label_column=cls"],
     "data.label_column='cls' is not a column"),
    ("hf-images: an image that cannot be read", _broken_image, ["data.paths=[imgs]"],
     "circles/9.png: not an image that can be read"),
    ("hf-images: two sizes", _two_sizes, ["data.paths=[imgs]"],
     "are of 2 sizes (16x16 and 20x12): set data.image_size"),
    ("hf-images: an override the classes contradict", _images, ["data.paths=[imgs]", "model.overrides.num_labels=5"],
     "model.overrides.num_labels=5, but the data has num_labels=2"),
    ("hf-images: a Hub id offline", _images, ["data.name=someone/pictures"],
     "data.name='someone/pictures' is read from the Hugging Face Hub"),
    ("settings: a block longer than the positions", _text,
     ["data.source=text", "data.paths=[stories.txt]", "data.block_size=100000"],
     "data.block_size=100000 is longer than the model's max_position_embeddings=512"),
    ("settings: a tab in a recipe file", lambda folder: (folder / "mine.yaml").write_text(
        "model:\n\tpreset: fem-lm-tiny\n"), ["--recipe-file"], "mine.yaml: a tab at line 2, column 1"),
    ("settings: a Hub tokenizer offline", _text, ["tokenizer.name=gpt2"],
     "tokenizer.name='gpt2' is read from the Hugging Face Hub"),
    ("settings: a Hub warm start offline", _text, ["model.init_from=gpt2"],
     "model.init_from='gpt2' is read from the Hugging Face Hub"),
]
RECIPES = {"hf-images": ("tel-vit-digits", TINY_IMAGES), "hf-sudoku": ("hyperset-sudoku-4x4",
                                                                        ["data.source=hf-sudoku", "training.steps=2"])}


@pytest.mark.parametrize(("case", "write", "settings", "said"), MISTAKES, ids=[case[0] for case in MISTAKES])
def test_a_mistake_in_ones_own_data_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch, case, write,
                                                                     settings, said):
    monkeypatch.chdir(tmp_path)
    write(tmp_path)
    recipe, tiny = RECIPES.get(case.split(":")[0], ("fem-lm-tiny", TINY_LM))
    if settings == ["--recipe-file"]:
        recipe, settings = "mine.yaml", []
    before = folder_digest(tmp_path)
    code, error = answer(capsys, ["train", recipe, *tiny, *settings, "output_dir=run"])
    assert code == 2 and said in one_line(error), error
    assert not (tmp_path / "run").exists() and folder_digest(tmp_path) == before


def test_the_hub_out_of_reach_without_offline_mode_is_one_line_too(tmp_path, capsys, monkeypatch):
    """No HF_HUB_OFFLINE, but nothing answers at the endpoint: found in one connection attempt, not after the
    libraries' retries, and the cache is still tried (it has no gpt2 here)."""
    from huggingface_hub import constants

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens
    hub_access.hub_reachable.cache_clear()
    try:
        code, error = answer(capsys, ["train", "fem-lm-tiny", *TINY_LM, "tokenizer.name=gpt2", "output_dir=run"])
    finally:
        hub_access.hub_reachable.cache_clear()
    line = one_line(error)
    assert code == 2 and "cannot be reached from here, and no cached copy" in line and "HF_HUB_OFFLINE" not in line


# text and JSONL as they are -------------------------------------------------------------------------------------
def blocks_of(settings: list[str], tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    return language_model_blocks(load_recipe("fem-lm-tiny", settings).data, tokenizer)


def packed(documents: list[str], tokenizer, size: int) -> torch.Tensor:
    """An independent packing: token ids and EOS, document after document, cut into whole blocks."""
    ids = [token for text in documents for token in tokenizer.encode(text) + [tokenizer.eos_token_id]]
    return torch.tensor(ids[: len(ids) // size * size]).view(-1, size)


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(TOPICS[:50], vocab_size=400)


def test_one_text_file_trains_its_paragraphs_with_every_tenth_held_out(tmp_path, tokenizer, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    paragraphs = paragraphs_file(tmp_path / "stories.txt")
    train, validation = blocks_of(["data.source=text", "data.paths=[stories.txt]", "data.block_size=32"], tokenizer)
    held = [text for index, text in enumerate(paragraphs) if index % 10 == 9]
    kept = [text for index, text in enumerate(paragraphs) if index % 10 != 9]
    assert torch.equal(validation, packed(held, tokenizer, 32)) and torch.equal(train, packed(kept, tokenizer, 32))
    code, error = answer(capsys, ["train", "fem-lm-tiny", *TINY_LM, "data.source=text", "data.paths=stories.txt",
                                  "output_dir=run"])
    assert code == 0, error
    said = [line for line in error.splitlines() if "validation blocks" in line]
    assert said and f"every 10th of {len(paragraphs)} documents" in said[0]


def test_a_file_of_one_paragraph_holds_out_every_tenth_block_of_its_tokens(tmp_path, tokenizer, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = " ".join(" ".join(topic.split()) for topic in TOPICS[:6])
    (tmp_path / "one.txt").write_text(text)
    train, validation = blocks_of(["data.source=text", "data.paths=[one.txt]", "data.block_size=32"], tokenizer)
    every = packed([text], tokenizer, 32)
    assert len(validation) >= 1 and torch.equal(validation, every[9::10])
    assert torch.equal(train, torch.cat([every[index:index + 9] for index in range(0, len(every), 10)]))


def test_crlf_a_bom_a_folder_and_a_glob_read_as_the_plain_files(tmp_path, tokenizer, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "texts").mkdir()
    first, second = paragraphs_file(tmp_path / "texts/a.txt", 30), paragraphs_file(tmp_path / "texts/b.md", 50)[30:]
    (tmp_path / "texts/b.md").write_text("\n\n".join(second))
    (tmp_path / "texts/.hidden.txt").write_text("not read")
    plain = blocks_of(["data.source=text", "data.paths=[texts/a.txt,texts/b.md]"], tokenizer)
    windows = "\ufeff" + "\r\n\r\n".join(first)
    (tmp_path / "windows.txt").write_bytes(windows.encode("utf-8"))
    for paths in ("[texts]", "[texts/*]", "['texts/**/*.*']", "[windows.txt,texts/b.md]"):
        blocks = blocks_of(["data.source=text", f"data.paths={paths}"], tokenizer)
        assert all(torch.equal(got, want) for got, want in zip(blocks, plain, strict=True)), paths


def test_paths_in_a_recipe_file_are_read_from_its_folder_and_on_the_command_line_from_here(tmp_path, monkeypatch,
                                                                                            capsys):
    (tmp_path / "project/data").mkdir(parents=True)
    paragraphs_file(tmp_path / "project/data/stories.txt")
    (tmp_path / "project/recipe.yaml").write_text(yaml.safe_dump(
        {"model": {"preset": "fem-lm-tiny"}, "data": {"source": "jsonl", "paths": "data/stories.jsonl",
                                                       "text_field": "body"}, "output_dir": "run"}))
    (tmp_path / "project/data/stories.jsonl").write_text(
        "".join(json.dumps({"body": text}) + "\n" for text in TOPICS[:30]))
    monkeypatch.chdir(tmp_path)  # the recipe lies elsewhere
    code, error = answer(capsys, ["train", "project/recipe.yaml", *TINY_LM])
    assert code == 0, error
    saved = yaml.safe_load((tmp_path / "run/recipe.yaml").read_text())
    assert saved["data"]["paths"] == [str(tmp_path / "project/data/stories.jsonl")]
    # on the command line: from the folder the command runs in
    code, error = answer(capsys, ["train", "project/recipe.yaml", *TINY_LM, "data.source=text",
                                  "data.paths=project/data/stories.txt", "output_dir=run2"])
    assert code == 0, error
    code, error = answer(capsys, ["train", "project/recipe.yaml", *TINY_LM, "data.source=text",
                                  "data.paths=data/stories.txt", "output_dir=run3"])
    assert code == 2 and f"{tmp_path}/data/stories.txt: no such file" in one_line(error)


def test_the_card_names_the_files_not_a_python_list(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    paragraphs_file(tmp_path / "stories.txt")
    assert main(["train", "fem-lm-tiny", *TINY_LM, "data.source=text", "data.paths=[stories.txt]",
                 "output_dir=run"]) == 0
    assert main(["export", "run/model", "export"]) == 0
    card = (tmp_path / "export/README.md").read_text()
    assert "local text files (./stories.txt)" in card and "['" not in card and str(tmp_path) not in card


# runs that never started ----------------------------------------------------------------------------------------
def test_a_run_that_failed_before_its_first_step_is_not_in_the_way(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    paragraphs_file(tmp_path / "stories.txt")
    command = ["train", "fem-lm-tiny", *TINY_LM, "data.source=text", "output_dir=run"]
    assert answer(capsys, [*command, "data.paths=[story.txt]"])[0] == 2
    assert not (tmp_path / "run").exists()
    code, error = answer(capsys, [*command, "data.paths=[stories.txt]"])  # the same command, corrected
    assert code == 0, error
    finished = folder_digest(tmp_path / "run")
    # --overwrite that fails before its first step leaves the run it was to replace as it was
    code, error = answer(capsys, [*command, "data.paths=[story.txt]", "--overwrite"])
    assert code == 2 and folder_digest(tmp_path / "run") == finished
    assert not (tmp_path / "run/.replaced-run").exists()
    code, error = answer(capsys, [*command, "data.paths=[stories.txt]", "training.seed=1", "--overwrite"])
    assert code == 0 and "earlier --overwrite" not in error and not (tmp_path / "run/.replaced-run").exists()


@pytest.mark.parametrize("asked", [["--suite", "general"], ["--tasks", "hellaswag"]])
def test_an_eval_that_cannot_reach_the_hub_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch, capsys, asked):
    monkeypatch.chdir(tmp_path)
    paragraphs_file(tmp_path / "stories.txt")
    assert main(["train", "fem-lm-tiny", *TINY_LM, "data.source=text", "data.paths=[stories.txt]",
                 "output_dir=run"]) == 0
    assert main(["export", "run/model", "export"]) == 0
    capsys.readouterr()
    assert main(["eval", "export", *asked]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{' '.join(asked)} is read from the Hugging Face Hub" in lines[0], lines
    assert "--suite local" in lines[0] and not (tmp_path / "export-eval").exists()


# image folders carry their facts --------------------------------------------------------------------------------
def test_an_image_folder_sets_the_classes_size_and_channels_and_the_pipeline_names_them(tmp_path, monkeypatch,
                                                                                         capsys):
    from transformers import pipeline

    monkeypatch.chdir(tmp_path)
    draw_images(tmp_path / "gray", {"circle": 6, "square": 6, "zigzag": 6}, size=(12, 12), mode="L")
    code, error = answer(capsys, ["train", "tel-vit-digits", *TINY_IMAGES, "data.paths=[gray]",
                                  "model.overrides.patch_size=4", "output_dir=run"])
    assert code == 0, error
    assert "from the data: image_size=12, num_channels=1, 3 classes (circle, square, zigzag)" in error
    config = json.loads((tmp_path / "run/model/config.json").read_text())
    assert (config["id2label"], config["image_size"], config["num_channels"]) == (
        {"0": "circle", "1": "square", "2": "zigzag"}, 12, 1)
    assert main(["export", "run/model", "export"]) == 0
    classify = pipeline("image-classification", model=str(tmp_path / "export"), trust_remote_code=True)
    image = Image.open(tmp_path / "gray/square/0.png")
    assert {row["label"] for row in classify(image, top_k=3)} == {"circle", "square", "zigzag"}
    # images of several sizes train at the size named; a model without an image size (ResNet) reads its channels
    draw_images(tmp_path / "mixed", {"a": 5, "b": 5})
    draw_images(tmp_path / "mixed", {"b": 1}, size=(24, 10))
    code, error = answer(capsys, ["train", "tel-resnet-digits", *TINY_IMAGES, "data.paths=[mixed]",
                                  "data.image_size=8", "output_dir=resnet"])
    assert code == 0, error
    config = json.loads((tmp_path / "resnet/model/config.json").read_text())
    assert config["num_channels"] == 3 and config["id2label"] == {"0": "a", "1": "b"} and "image_size" not in config


def test_finetune_with_trainer_takes_ones_own_images(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    draw_images(tmp_path / "imgs", {"circles": 6, "squares": 6})
    assert main(["train", "tel-vit-digits", *TINY_IMAGES, "data.paths=[imgs]", "output_dir=run"]) == 0
    draw_images(tmp_path / "more", {"round": 6, "boxy": 6})
    trained = AutoModelForImageClassification.from_pretrained(tmp_path / "run/model")
    before = {name: parameter.detach().clone() for name, parameter in trained.named_parameters()}
    trainer = finetune_with_trainer("run/model", tmp_path / "tuned", max_steps=2, batch_size=4,
                                    data={"source": "hf-images", "name": "imagefolder", "paths": ["more"]})
    assert trainer.model.config.id2label == {0: "boxy", 1: "round"}  # imagefolder sorts the class folders
    assert any(not torch.equal(before[name], parameter.detach()) for name, parameter in
               trainer.model.named_parameters())
    draw_images(tmp_path / "three", {"a": 4, "b": 4, "c": 4})
    with pytest.raises(UserError, match=r"3 classes \(a, b, c\), but the model's head has 2"):
        finetune_with_trainer("run/model", tmp_path / "tuned3", max_steps=1,
                              data={"source": "hf-images", "name": "imagefolder", "paths": ["three"]})


def test_an_image_folders_grayscale_pixels_are_the_images_scaled(tmp_path, monkeypatch):
    """The pixels trained on are the files' own 8-bit values scaled to [-1, 1] (PIL read independently)."""
    from energyzoo.data.images import hub_image_split

    monkeypatch.chdir(tmp_path)
    draw_images(tmp_path / "gray", {"a": 3, "b": 3}, size=(6, 6), mode="L")
    data = load_recipe("tel-vit-digits", ["data.source=hf-images", "data.name=imagefolder", "data.paths=[gray]",
                                          "data.validation_fraction=0.5"]).data
    split = hub_image_split(data, seed=0)
    images = torch.cat([split.tensors[0], split.tensors[2]])
    expected = sorted(torch.tensor(list(Image.open(path).getdata()), dtype=torch.float32).div(127.5).sub(1).sum().item()
                      for path in sorted((tmp_path / "gray").rglob("*.png")))
    assert images.shape == (6, 1, 6, 6)
    assert sorted(image.sum().item() for image in images) == pytest.approx(expected, abs=1e-4)


def test_exporting_a_folder_removed_while_it_is_read_is_one_line(tmp_path, monkeypatch, capsys):
    """A checkpoint that a running training's rotation deletes under the export: said so, not looked up as a Hub
    repository of that name."""
    from energyzoo.export import hub_folder

    monkeypatch.chdir(tmp_path)
    paragraphs_file(tmp_path / "stories.txt")
    assert main(["train", "fem-lm-tiny", *TINY_LM, "data.source=text", "data.paths=[stories.txt]",
                 "output_dir=run"]) == 0
    reading = hub_folder.AutoConfig.from_pretrained

    def rotated_away(folder, **options):
        config = reading(folder, **options)
        shutil.rmtree(folder)
        return config

    monkeypatch.setattr(hub_folder.AutoConfig, "from_pretrained", rotated_away)
    capsys.readouterr()
    assert main(["export", "run/model", "export"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "run/model was removed while it was read" in lines[0], lines
