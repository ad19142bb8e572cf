"""Every file of every kind of folder energyzoo reads, damaged (cut at a few points, emptied, deleted, overwritten
with garbage), under every verb that reads that folder: the verb answers with exit code 0 (the file is one it does
not need) or 2 in one line (`energyzoo VERB: error: ...`), never a traceback or "internal error", and changes nothing
but its own output (nothing at all when it refuses).

The fast tier runs a fixed sample (the cases a user met, `SAMPLE`); the slow tier sweeps every file x damage x verb.
"""

import hashlib
import io
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from support.original_checkpoints import LAYOUTS, saved_original

from energyzoo.cli import main
from energyzoo.files import check_model_folder
from energyzoo.training.recipe import load_recipe
from energyzoo.training.run import run_training

RUN = ["training.steps=4", "training.save_every=2", "training.eval_every=2", "training.log_every=1",
       "training.warmup_steps=1", "training.batch_size=4", "model.overrides.hidden_size=32",
       "model.overrides.intermediate_size=64", "model.overrides.num_hidden_layers=2", "tokenizer.train_vocab_size=300"]
DAMAGES = {
    "cut to 1 byte": lambda data: data[:1],
    "cut in half": lambda data: data[: len(data) // 2],
    "cut 1 byte short": lambda data: data[:-1],
    "emptied": lambda data: b"",
    "deleted": None,
    "garbage": lambda data: random.Random(len(data)).randbytes(max(len(data), 64)),
}
CHECKPOINT = "checkpoints/step-0000002"
ORIGINAL = "sudoku"  # the authors' Hyper-SET layout converted


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """The folders a user hands energyzoo, written by energyzoo itself: a run folder (``run``, with a checkpoint at
    step 2 and its ``model``), an export of that model (``export``), an authors' Hyper-SET checkpoint file
    (``original``) and its conversion (``converted``)."""
    root = tmp_path_factory.mktemp("folders")
    run_training(load_recipe("fem-lm-tiny", [*RUN, f"output_dir={root / 'run'}"]), progress=False)
    assert main(["export", str(root / "run" / "model"), str(root / "export")]) == 0
    original = saved_original(root, ORIGINAL)
    original.rename(root / "original.pth")
    options = [item for key, value in LAYOUTS[ORIGINAL]["options"].items() for item in ("--set", f"{key}={value}")]
    assert main(["convert", "hyperset-original", str(root / "original.pth"), str(root / "converted"), *options]) == 0
    return root


def _eval(folder: str, *more: str) -> list[str]:
    return ["eval", folder, *more, "--tasks", "energyzoo_pydoc_mc", "--limit", "2", "--batch-size", "2",
            "--output-dir", "out"]


# verb: (the folder it reads, under the case's copy of `folders`; its command line, run in the case's folder)
VERBS = {
    "eval": ("run/model", _eval("run/model")),
    "export": ("run/model", ["export", "run/model", "out"]),
    "init_from": ("run/model", ["train", "fem-lm-tiny", *RUN, "training.steps=1", "model.init_from=run/model",
                                "output_dir=out"]),
    "eval an export": ("export", _eval("export")),
    "export an export": ("export", ["export", "export", "out"]),
    "resume": ("run", ["train", "run/recipe.yaml", "output_dir=run", "--resume"]),
    "eval a checkpoint": (f"run/{CHECKPOINT}/model", _eval("run", "--checkpoint", "step-2")),
    "export a checkpoint": (f"run/{CHECKPOINT}/model", ["export", "run", "out", "--checkpoint", "step-2"]),
    "export a conversion": ("converted", ["export", "converted", "out"]),
    "convert": ("original.pth", ["convert", "hyperset-original", "original.pth", "out"]),
}
# what each verb may write when it succeeds: its output, and for a resumed run the run folder
WRITES = {"resume": ("run",)}


def tree(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(root.rglob("*")) if path.is_file()}


def damaged_copy(folders: Path, case: Path, target: str, damage: str) -> None:
    shutil.copytree(folders, case)
    path = case / target
    if DAMAGES[damage] is None:
        path.unlink()
    else:
        path.write_bytes(DAMAGES[damage](path.read_bytes()))


def answered(capsys, monkeypatch, case: Path, verb: str) -> str | None:
    """Run ``verb`` in the damaged ``case`` folder; what is wrong with its answer, or None."""
    monkeypatch.chdir(case)
    before = tree(case)
    code = main(VERBS[verb][1])
    err = capsys.readouterr().err
    after = tree(case)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if code == 2:
        if len(lines) != 1 or not lines[0].startswith(f"energyzoo {VERBS[verb][1][0]}: error: "):
            return f"exit 2 but not one error line: {err[-600:]!r}"
        if after != before:
            return f"refused but changed {sorted(set(after.items()) ^ set(before.items()))[:3]}"
        return None
    if code != 0 or "Traceback" in err or "internal error" in err:
        return f"exit {code}: {err[-600:]!r}"
    own = ("out", *WRITES.get(verb, ()))
    changed = {name for name in set(before) | set(after) if before.get(name) != after.get(name)}
    if stray := sorted(name for name in changed if not name.startswith(own)):
        return f"exit 0 but changed what is not its output: {stray[:3]}"
    return None


# what a resumed run reads of its checkpoint: its state, manifest, optimizer, scheduler, random states and the model's
# weights and config (not the remote code beside them, which a model folder carries for machines without energyzoo)
RESUMED = ("trainer_state.json", "manifest.json", "optimizer.bin", "scheduler.bin", "random_states_0.pkl",
           "model/model.safetensors", "model/config.json")


def files_read(folders: Path, verb: str) -> list[str]:
    """The files ``verb`` reads, relative to `folders`: every file of its folder but the model card (a README.md,
    written for people, which no verb reads), and for a resumed run the run's recipe, log, tokenizer and what it reads
    of its checkpoint (`RESUMED`; the run's own model folder, loss curve and trackers are what it writes)."""
    read = folders / VERBS[verb][0]
    paths = [read] if read.is_file() else sorted(path for path in read.rglob("*")
                                                 if path.is_file() and path.suffix != ".md")
    names = [str(path.relative_to(folders)) for path in paths]
    if verb == "resume":
        checkpoint = [f"run/{CHECKPOINT}/{name}" for name in RESUMED]
        names = [name for name in names if name.startswith(("run/recipe", "run/metrics", "run/tokenizer/"))
                 or name in checkpoint]
    return names


# a user's cases: each verb on its most read files, every damage once
SAMPLE = [
    ("eval", "run/model/config.json", "cut in half"),
    ("eval", "run/model/model.safetensors", "cut 1 byte short"),
    ("eval", "run/model/tokenizer.json", "deleted"),
    ("eval an export", "export/tokenizer_config.json", "deleted"),
    ("export", "run/model/model.safetensors", "garbage"),
    ("export a conversion", "converted/config.json", "emptied"),
    ("init_from", "run/model/model.safetensors", "cut to 1 byte"),
    ("resume", f"run/{CHECKPOINT}/trainer_state.json", "garbage"),
    ("resume", "run/metrics.jsonl", "cut in half"),
    ("export a checkpoint", f"run/{CHECKPOINT}/model/config.json", "garbage"),
    ("convert", "original.pth", "garbage"),
    ("convert", "original.pth", "cut in half"),
]


@pytest.mark.parametrize(("verb", "target", "damage"), SAMPLE, ids=[" / ".join(case) for case in SAMPLE])
def test_a_damaged_file_is_answered_in_one_line_and_changes_nothing(folders, tmp_path, capsys, monkeypatch, verb,
                                                                    target, damage):
    damaged_copy(folders, tmp_path / "case", target, damage)
    assert answered(capsys, monkeypatch, tmp_path / "case", verb) is None


@pytest.mark.slow
@pytest.mark.parametrize("verb", VERBS)
def test_every_damage_of_every_file_a_verb_reads_is_answered_in_one_line(folders, tmp_path, capsys, monkeypatch,
                                                                           verb):
    wrong = {}
    for target in files_read(folders, verb):
        for damage in DAMAGES:
            case = tmp_path / f"case-{len(wrong)}-{target.replace('/', '_')}-{damage.replace(' ', '_')}"
            damaged_copy(folders, case, target, damage)
            if why := answered(capsys, monkeypatch, case, verb):
                wrong[f"{target} {damage}"] = why
            shutil.rmtree(case)
    assert not wrong, f"{len(wrong)} damaged files answered wrongly by {verb}: {dict(list(wrong.items())[:4])}"


def _zip_of_something_else(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("notes/readme.txt", "not a checkpoint")
    return buffer.getvalue()


# files that were never what the verb reads, in place of the file it takes
NEVER = {"a line of text": lambda data: b"some notes about the run\n", "empty": lambda data: b"",
         "random bytes": lambda data: random.Random(0).randbytes(3000),
         "a zip of something else": _zip_of_something_else}
FILE_VERBS = {"convert": ("original.pth", ["convert", "hyperset-original", "original.pth", "out"]),
              "train a recipe": ("recipe.yaml", ["train", "recipe.yaml"])}


@pytest.mark.parametrize("verb", FILE_VERBS)
@pytest.mark.parametrize("never", NEVER)
def test_a_file_that_never_was_one_the_verb_takes_is_answered_in_one_line(folders, tmp_path, capsys, monkeypatch,
                                                                           verb, never):
    case = tmp_path / "case"
    case.mkdir()
    name, args = FILE_VERBS[verb]
    (case / name).write_bytes(NEVER[never](b""))
    monkeypatch.chdir(case)
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"energyzoo {args[0]}: error: ") and name in lines[0], lines
    assert sorted(path.name for path in case.iterdir()) == [name]


def test_every_folder_energyzoo_writes_passes_its_own_check(folders, tmp_path, capsys):
    """Run models, checkpoints, exports and every task's conversion (an image classifier's processor included) read
    back whole, and export again; an eval of an export leaves the export as it was and puts its results beside it."""
    written = [folders / "run" / "model", folders / "run" / CHECKPOINT / "model", folders / "export",
               folders / "converted"]
    for layout in ("ic-hyper-set", "maskgit"):
        original = saved_original(tmp_path, layout)
        options = [item for key, value in LAYOUTS[layout]["options"].items() for item in ("--set", f"{key}={value}")]
        assert main(["convert", "hyperset-original", str(original), str(tmp_path / layout), *options]) == 0
        written.append(tmp_path / layout)
    for folder in written:
        check_model_folder(folder)
        assert main(["export", str(folder), str(tmp_path / "again" / folder.name)]) == 0, capsys.readouterr().err
        check_model_folder(tmp_path / "again" / folder.name)
    export = shutil.copytree(folders / "export", tmp_path / "exported")
    before = tree(export)
    assert main(_eval(str(export))[:-2]) == 0  # its default output folder
    assert tree(export) == before and (tmp_path / "exported-eval" / "tasks.json").is_file()
    assert main(["export", str(export), str(tmp_path / "re-export")]) == 0
    assert main(_eval(str(export), "--output-dir", str(export / "eval"))[:-2]) == 2
    assert "lies in the exported folder" in capsys.readouterr().err


def _writing_verbs(root: Path) -> dict[str, list[str]]:
    """Each verb that writes a folder, writing into ``root/out``."""
    return {"train": ["train", "fem-lm-tiny", *RUN, f"output_dir={root / 'out'}"],
            "export": ["export", str(root / "run" / "model"), str(root / "out")],
            "eval": _eval(str(root / "run" / "model"))[:-1] + [str(root / "out")],
            "convert": ["convert", "hyperset-original", str(root / "original.pth"), str(root / "out"),
                        *(item for key, value in LAYOUTS[ORIGINAL]["options"].items()
                          for item in ("--set", f"{key}={value}"))]}


def _run_limited(args: list[str], file_size: int | None = None) -> subprocess.CompletedProcess:
    def limit():
        if file_size is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    return subprocess.run([sys.executable, "-m", "energyzoo.cli", *args], capture_output=True, text=True,
                          timeout=600, preexec_fn=limit)


def _debris(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.name.endswith(".partial"))


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["file-size limit", "output path is a file"])
@pytest.mark.parametrize("verb", ["train", "export", "eval", "convert"])
def test_a_write_fault_is_answered_in_one_line_and_leaves_no_debris(folders, tmp_path, verb, fault):
    root = shutil.copytree(folders, tmp_path / "case")
    args = _writing_verbs(root)[verb]
    if fault == "output path is a file":
        (root / "out").write_text("a file of the user's")
    before = tree(root)
    done = _run_limited(args, file_size=2048 if fault == "file-size limit" else None)
    lines = [line for line in done.stderr.strip().splitlines() if line.strip() and "%|" not in line
             and "WARNING" not in line and "[W" not in line]
    assert done.returncode == 2 and lines[-1].startswith(f"energyzoo {args[0]}: error: "), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert not _debris(root)
    changed = {name for name in set(before) | set(tree(root)) if before.get(name) != tree(root).get(name)}
    assert all(name.startswith("out") for name in changed), changed


@pytest.mark.slow
def test_ctrl_c_during_training_says_where_resume_continues_and_leaves_no_debris(tmp_path):
    args = ["train", "fem-lm-tiny", *RUN, "training.steps=3000", "training.save_every=50", "training.eval_every=3000",
            f"output_dir={tmp_path / 'run'}"]
    process = subprocess.Popen([sys.executable, "-m", "energyzoo.cli", *args], stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while not list((tmp_path / "run" / "checkpoints").glob("step-*")) and process.poll() is None:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=300)
    last = err.strip().splitlines()[-1]
    assert process.returncode == 130 and "Traceback" not in err, err[-2000:]
    steps = [int(part) for part in last.replace(";", " ").split() if part.isdigit()]
    assert last.startswith("energyzoo train: stopped at step ") and "--resume continues from step" in last
    assert steps[1] % 50 == 0 and steps[0] >= steps[1] >= 50, last
    assert not _debris(tmp_path)
