"""How the CLI answers every case of the damaged-file sweep (`tests/test_damaged_files.py`: the files each verb reads
x its damages x the verbs), counted for the energyzoo this interpreter imports, so that two checkouts compare:

    PYTHONPATH=<checkout> python scripts/damaged_files_counts.py <tests folder> counts.json

Outcomes: "one line, exit 2" (refused in one line, as the README promises), "exit 0" (the verb succeeded: the file
was one it does not need, or it copied the damage along), "reached the work" (the files were accepted and the verb
went on to evaluate or train: lm-eval's task manager and the training step are stopped there, as the work itself
takes minutes and says nothing of the files) and "traceback or more" (anything else).
"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path


class ReachedWork(BaseException):
    """The verb accepted its files and reached the evaluation or the training loop (a BaseException: the CLI's own
    handlers must not answer it)."""


def reached(*args, **kwargs):
    raise ReachedWork


def outcome(code, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    if code == "work":
        return "reached the work"
    if code == 0:
        return "exit 0"
    return "one line, exit 2" if code == 2 and len(lines) == 1 else "traceback or more"


def main(tests: Path, output: Path) -> None:
    sys.path[:0] = [str(tests), str(tests / "support")]
    import lm_eval
    import lm_eval.tasks
    import test_damaged_files as sweep
    from original_checkpoints import LAYOUTS, saved_original

    import energyzoo.training.run as run_module
    from energyzoo.cli import main as cli
    from energyzoo.training.recipe import load_recipe

    root = Path(tempfile.mkdtemp())
    folders = root / "folders"
    folders.mkdir()
    run_module.run_training(load_recipe("fem-lm-tiny", [*sweep.RUN, f"output_dir={folders / 'run'}"]),
                            progress=False)
    assert cli(["export", str(folders / "run" / "model"), str(folders / "export")]) == 0
    saved_original(folders, sweep.ORIGINAL).rename(folders / "original.pth")
    options = [item for key, value in LAYOUTS[sweep.ORIGINAL]["options"].items()
               for item in ("--set", f"{key}={value}")]
    assert cli(["convert", "hyperset-original", str(folders / "original.pth"), str(folders / "converted"),
                *options]) == 0
    lm_eval.simple_evaluate = lm_eval.tasks.TaskManager = reached
    run_module._Run.optimizer_step = reached
    counts = {}
    for verb in sweep.VERBS:
        tally = dict.fromkeys(("one line, exit 2", "exit 0", "reached the work", "traceback or more"), 0)
        for target in sweep.files_read(folders, verb):
            for damage in sweep.DAMAGES:
                case = root / "case"
                shutil.rmtree(case, ignore_errors=True)
                sweep.damaged_copy(folders, case, target, damage)
                os.chdir(case)
                err = io.StringIO()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    try:
                        code = cli(sweep.VERBS[verb][1])
                    except SystemExit as stop:
                        code = stop.code
                    except ReachedWork:
                        code = "work"
                os.chdir(root)
                tally[outcome(code, err.getvalue())] += 1
        counts[verb] = tally
        print(verb, tally, flush=True)
    output.write_text(json.dumps(counts, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
