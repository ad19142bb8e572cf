"""The documents do what they say. Every ```bash block of the README and of docs/ is preceded by a
``<!-- doc-test: ... -->`` line that either runs it (each line as written, in a fresh folder, with the tiny settings it
names put before each `energyzoo train`'s own) or says why it cannot run here (an install, the network, a GPU). Every
rendered table is the rendering of the shipped measurements (`energyzoo.documents`)."""

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from energyzoo.documents import BLOCK as RENDERED
from energyzoo.documents import render_document

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"(?:<!-- doc-test: (?P<directive>.*?) -->\n)?```bash\n(?P<commands>.*?)```", re.S)
TINY = re.compile(r"run, every `energyzoo train` with (?P<settings>.*) before its own settings")


def command_blocks() -> list[tuple[str | None, list[str]]]:
    """(directive, command lines without their comments) of every bash block of the documents."""
    blocks = []
    for match in BLOCK.finditer("\n".join(document.read_text() for document in DOCUMENTS)):
        joined = match["commands"].replace("\\\n", " ")
        lines = [line.split("  #")[0].strip() for line in joined.splitlines()]
        blocks.append((match["directive"], [line for line in lines if line and not line.startswith("#")]))
    return blocks


def with_settings(command: str, settings: list[str]) -> list[str]:
    """``command`` as arguments, ``settings`` put right after the recipe of a `train` command."""
    words = shlex.split(command)
    if "train" in words:
        recipe = words.index("train") + 1
        words[recipe + 1 : recipe + 1] = settings
    return words


def test_every_command_block_is_run_or_says_why_not():
    blocks = command_blocks()
    assert blocks
    for directive, commands in blocks:
        assert directive and (TINY.fullmatch(directive) or directive.startswith("not run: ")), commands


RUN_BLOCKS = [commands for directive, commands in command_blocks() if directive and TINY.fullmatch(directive)]


def trained_folder(command: str, folder: Path) -> Path:
    """The run folder a `train` command run in ``folder`` writes: its output_dir, or its recipe's."""
    words = shlex.split(command)
    given = [word.removeprefix("output_dir=") for word in words if word.startswith("output_dir=")]
    if given:
        return folder / given[0]
    recipe = words[words.index("train") + 1]
    path = folder / recipe if recipe.endswith(".yaml") else ROOT / "energyzoo/recipes" / f"{recipe}.yaml"
    return folder / yaml.safe_load(path.read_text())["output_dir"]


@pytest.mark.slow
@pytest.mark.parametrize("commands", RUN_BLOCKS, ids=[f"block{index}" for index in range(len(RUN_BLOCKS))])
def test_a_runnable_block_runs_as_written(commands, tmp_path):
    (directive,) = [d for d, c in command_blocks() if c == commands]
    settings = TINY.fullmatch(directive)["settings"].split()
    (tmp_path / "energyzoo").symlink_to(ROOT / "energyzoo")  # the block names energyzoo/recipes/... from the checkout
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in commands:
        done = subprocess.run(with_settings(command, settings), cwd=tmp_path, capture_output=True, text=True,
                              timeout=600, env=environment)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        if "--stop-after" in command:
            assert "stopped after step 6 (one process); continue with --resume" in done.stdout
            assert (tmp_path / "runs/tiny/checkpoints/step-0000006/trainer_state.json").is_file()
        if "--resume" in command:  # the progress bar starts at the saved step
            assert " 6/20 [" in done.stderr and " 1/20 [" not in done.stderr, done.stderr[-2000:]
            assert "trained 20 steps" in done.stdout
        if "train" in shlex.split(command) and "--stop-after" not in command:
            assert (trained_folder(command, tmp_path) / "model/config.json").is_file(), command
        if "export" in command:
            assert (tmp_path / shlex.split(command)[3] / "config.json").is_file(), command
    if any("imagefolder" in command for command in commands):  # the folder's classes reach the model
        config = json.loads((tmp_path / "runs/images/model/config.json").read_text())
        assert config["id2label"] == {"0": "circles", "1": "squares"} and config["image_size"] == 16


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_rendered_table_is_the_rendering_of_the_shipped_measurements(document):
    text = document.read_text()
    stale = f"stale tables: run python -m energyzoo.documents {document.relative_to(ROOT)}"
    assert text == render_document(text), stale


def test_the_family_pages_render_every_bench_entry_and_experiment():
    """Each bench entry and each experiment has its table on some page (a new one without a page fails here)."""
    from energyzoo.registry import ARCHITECTURES
    from energyzoo.reproduce.experiments import EXPERIMENTS

    named = {(match["kind"], name) for document in DOCUMENTS for match in RENDERED.finditer(document.read_text())
             for name in match["names"].split()}
    assert {("bench", name) for name, entry in ARCHITECTURES.items() if entry.bench} <= named
    assert {("ledger", name) for name in EXPERIMENTS} <= named


CARDS = sorted((ROOT / "energyzoo" / "export" / "templates").glob("*.md"))
MEASURED = re.compile(r"\d(?:\.\d+)? ?(?:±|\+-) ?\d")  # a measured mean with its spread


@pytest.mark.parametrize("document", [*DOCUMENTS, *CARDS], ids=lambda path: str(path.relative_to(ROOT)))
def test_measured_numbers_appear_only_in_rendered_blocks(document):
    """A measurement (a mean ± its spread) written by hand drifts from the data it came from: prose points to the
    rendered tables (bench.json, ledger.json) instead."""
    prose = RENDERED.sub("", document.read_text())
    assert not [line for line in prose.splitlines() if MEASURED.search(line)], f"measured numbers in the prose of " \
        f"{document.relative_to(ROOT)}: render them from ledger.json or bench.json"


# a number of the kinds a measurement is quoted in: a ratio, a percentage, a count of seeds
QUOTED = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?: ?x\b| ?%| seeds?\b)")
CITED = re.compile(r"Table|Fig\.|App\. [A-Z]|eq\. \d|§\d|\w+\.txt|the paper")  # a number quoted from a paper
FENCED = re.compile(r"```.*?```", re.S)
RULES = {  # numbers the project sets, not measures: (document, number) -> why it may be written by hand
    ("README.md", "5 seeds"): "the verdict rule's MIN_SEEDS",
    ("docs/contributing.md", "5 seeds"): "the verdict rule's MIN_SEEDS",
    ("docs/contributing.md", "2 x"): "the interval's confidence, a formula",
    ("docs/speed.md", "10 %"): "the bench's busy-machine flag (an IQR wider than 10 % of the ratio)",
    ("docs/speed.md", "4.5x"): "a performance target (linear growth of the O(T) priors)",
    ("docs/models/eqt.md", "0.66%"): "parameter counts of the presets, from their configs",
    ("docs/models/eqt.md", "000 x"): "a preset's memory buffer shape (10,000 x 1024)",
    ("docs/models/eqt.md", "7.4%"): "parameter counts of the presets, from their configs",
    ("docs/models/eqt.md", "2.7%"): "parameter counts of the presets, from their configs",
    ("energyzoo/export/templates/fem_reference_differences.md", "19 %"):
        "a property of the reference layer's rotation, computed in tests/test_fem_public_reference.py",
}


@pytest.mark.parametrize("document", [*DOCUMENTS, *CARDS], ids=lambda path: str(path.relative_to(ROOT)))
def test_every_number_in_prose_is_rendered_quoted_from_a_paper_or_a_rule(document):
    """The audit found hand-written measurements that had drifted from their tables (1.79x / 1.28x where the
    rendered table said 1.945 / 1.154; "3 seeds" on a page whose experiment ran 5). A ratio, percentage or seed count
    in prose is a paper's (cited on its line), one of the project's own rules (`RULES`, with the reason), or not
    written: the rendered tables (bench.json, ledger.json) carry the measurements."""
    name = str(document.relative_to(ROOT))
    lines = FENCED.sub("", RENDERED.sub("", document.read_text())).splitlines()
    loose = [(match.group(0), line.strip()[:100]) for before, line in zip(["", *lines], lines)
             if not CITED.search(before + " " + line)  # a citation on the line or the one it continues
             for match in QUOTED.finditer(line) if (name, match.group(0)) not in RULES]
    assert not loose, f"numbers in the prose of {name} that no table renders: {loose}"
