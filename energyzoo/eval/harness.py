"""`energyzoo eval MODEL_DIR --suite ...`: lm-evaluation-harness on a zoo LM (or any causal LM folder).

Suites:
- ``leaderboard``: the Open LLM Leaderboard v2 group of lm-eval (MMLU-Pro 5-shot, GPQA 0, BBH 3, MATH-hard 4,
  MuSR 0, IFEval), each with the harness's own few-shot setting (fem.txt App. L).
- ``general``: ARC-Challenge, ARC-Easy, HellaSwag, PIQA, BoolQ, WinoGrande, COPA, OpenBookQA, SciQ, 0-shot
  (fem.txt Table 2).
- ``local``: offline tasks energyzoo ships, built from held-out Python documentation topics (the ones the
  quickstart never trains on): ``energyzoo_pydoc_mc``, 4-way multiple choice of the next four words of a
  sentence; ``energyzoo_pydoc_ppl``, rolling perplexity (word / byte perplexity, bits per byte).
The first two download their datasets (online); ``local`` needs nothing.

Results: lm-eval's JSON in ``OUTPUT/<suite>.json`` and a markdown table in ``OUTPUT/<suite>.md`` (default
OUTPUT: ``MODEL_DIR/eval``), which `energyzoo export` turns into the card's `model-index`. An exported folder is what
gets pushed, as export wrote it: its results go beside it (default ``EXPORT-eval``), never into it, since lm-eval's
raw JSON names local paths and the machine's environment, which export leaves out.
"""

import json
import random
import re
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from unittest import mock

import yaml
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from ..data.hub_access import reaching_hub
from ..data.text import python_docs_corpus
from ..files import is_export, read_json, tokenizer_damage
from ..modeling.errors import UserError, needs_extra
from ..registry import ARCHITECTURES
from .suites import SUITES

# the tokenizer's alarm at an input longer than the model's context, which `tokenizer.deprecation_warnings` records as
# given once it was
LENGTH_ALARM = "sequence-length-is-longer-than-the-specified-maximum"
LOCAL_TASK_PREFIX = "energyzoo_"  # the local tasks' names (`write_local_tasks`): read from no Hub
LOCAL_VALIDATION_FRACTION = 0.1  # the quickstart's held-out topics
MC_CONTEXT_WORDS, MC_ANSWER_WORDS, MC_CHOICES = 8, 4, 4


def _sentences(texts: list[str]) -> list[list[str]]:
    words = []
    for text in texts:
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join(text.split())):
            tokens = sentence.split()
            if len(tokens) >= MC_CONTEXT_WORDS + MC_ANSWER_WORDS:
                words.append(tokens)
    return words


def local_task_documents(max_mc: int = 200, max_ppl: int = 30, ppl_chars: int = 2000) -> tuple[list[dict], list[dict]]:
    """(multiple-choice items, perplexity documents) from the held-out Python documentation topics."""
    _, held_out = python_docs_corpus(LOCAL_VALIDATION_FRACTION)
    sentences = _sentences(held_out)
    rng = random.Random(0)
    items = []
    for index, tokens in enumerate(sentences[:max_mc]):
        answer = " " + " ".join(tokens[MC_CONTEXT_WORDS : MC_CONTEXT_WORDS + MC_ANSWER_WORDS])
        others = [s for j, s in enumerate(sentences) if j != index]
        distractors = set()
        while len(distractors) < MC_CHOICES - 1:
            other = rng.choice(others)
            start = rng.randrange(0, len(other) - MC_ANSWER_WORDS + 1)
            candidate = " " + " ".join(other[start : start + MC_ANSWER_WORDS])
            if candidate != answer:
                distractors.add(candidate)
        choices = sorted(distractors)
        label = rng.randrange(MC_CHOICES)
        choices.insert(label, answer)
        items.append({"context": " ".join(tokens[:MC_CONTEXT_WORDS]), "choices": choices, "label": label})
    documents = [{"text": text[:ppl_chars]} for text in held_out[:max_ppl]]
    return items, documents


def write_local_tasks(directory: str | Path) -> Path:
    """Write the local tasks (JSONL data and lm-eval YAML with absolute paths) into `directory`; pass it as
    lm-eval's ``--include_path``."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    items, documents = local_task_documents()
    for name, rows in (("pydoc_mc", items), ("pydoc_ppl", documents)):
        (directory / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = {"dataset_path": "json", "test_split": "test", "metadata": {"version": 1.0}}
    tasks = {
        "energyzoo_pydoc_mc": {
            **common, "dataset_kwargs": {"data_files": {"test": str(directory / "pydoc_mc.jsonl")}},
            "output_type": "multiple_choice", "doc_to_text": "{{context}}", "doc_to_choice": "choices",
            "doc_to_target": "label",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True},
                            {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True}],
        },
        "energyzoo_pydoc_ppl": {
            **common, "dataset_kwargs": {"data_files": {"test": str(directory / "pydoc_ppl.jsonl")}},
            "output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
            "metric_list": [  # lm-eval's own aggregations for its rolling log-likelihood metrics
                {"metric": "word_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False},
                {"metric": "byte_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False},
                {"metric": "bits_per_byte", "aggregation": "bits_per_byte", "higher_is_better": False}],
        },
    }
    for name, task in tasks.items():
        (directory / f"{name}.yaml").write_text(yaml.safe_dump({"task": name, **task}, sort_keys=False))
    return directory


@dataclass(frozen=True)
class Score:
    """One value of lm-eval's results: ``task``'s ``metric`` under its ``filter`` ("none" unless the task filters)."""

    task: str
    metric: str
    filter: str
    value: float
    stderr: float | None


def scores(results: dict) -> list[Score]:
    """Every numeric metric of lm-eval's results (what `simple_evaluate` returns, or its saved JSON): lm-eval keys a
    task's values ``"metric,filter"`` and their standard errors ``"metric_stderr,filter"``; aliases and stderrs are
    not scores."""
    found = []
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or metric.endswith("_stderr") or not isinstance(value, (int, float)):
                continue
            stderr = metrics.get(f"{metric}_stderr,{filter_name}")
            found.append(Score(task, metric, filter_name, float(value),
                               float(stderr) if isinstance(stderr, (int, float)) else None))
    return found


def format_results_table(results: dict) -> str:
    """lm-eval's own markdown table of its results (`lm_eval.utils.make_table`)."""
    with needs_extra("eval"):
        from lm_eval.utils import make_table

    return make_table(results)


def require_causal_lm(model_dir: Path) -> None:
    """Refuse, in one line, a folder that holds no causal language model with its tokenizer: lm-evaluation-harness
    scores text with the logits of a causal LM (its HFLM), which a classifier or an image model does not give."""
    saved = read_json(model_dir / "config.json").get("architectures") or []
    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()) | {
        head.__name__ for entry in ARCHITECTURES.values() for task, head in entry.heads.items() if task == "causal-lm"}
    if not causal & set(saved):
        raise UserError(f"energyzoo eval runs lm-evaluation-harness, which scores causal language models; {model_dir} "
                         f"holds {', '.join(saved) or 'a model of no saved architecture'} (evaluate it with its own "
                         "task's metrics, which energyzoo train reports)")
    if why := tokenizer_damage(model_dir):
        raise UserError(f"{why}, which lm-evaluation-harness needs (its tasks are text)")


def windows_without_length_alarm(language_model) -> None:
    """Silence the tokenizer's "Token indices sequence length is longer than the specified maximum" while
    ``language_model`` (an HFLM) scores whole documents (``loglikelihood_rolling``, perplexity tasks), which it cuts
    into windows of the model's context itself: the alarm stays for every other request, whose input would be cut."""
    rolling = language_model.loglikelihood_rolling

    def scored_in_windows(*args, **kwargs):
        given = language_model.tokenizer.deprecation_warnings
        before = given.get(LENGTH_ALARM)
        given[LENGTH_ALARM] = True
        try:
            return rolling(*args, **kwargs)
        finally:
            if before is None:
                given.pop(LENGTH_ALARM, None)

    language_model.loglikelihood_rolling = scored_in_windows


@contextmanager
def labelled_progress():
    """lm-eval's two unlabelled bars, labelled beside its labelled bars of requests: over each task's documents, and
    over the documents a perplexity task cuts into windows (a bar that names itself keeps its name)."""
    from lm_eval.api import task
    from lm_eval.models import huggingface
    from tqdm import tqdm

    with (mock.patch.object(task, "tqdm", partial(tqdm, desc="Building contexts")),
          mock.patch.object(huggingface, "tqdm", partial(tqdm, desc="Cutting documents into windows"))):
        yield


@contextmanager
def unasked_lookups_off():
    """What lm-eval's evaluation does beyond what was asked, off: `datasets`' download-count ping (a request to
    s3.amazonaws.com for every packaged builder it loads, the local tasks' ``json`` included; `datasets`' own
    ``HF_UPDATE_DOWNLOAD_COUNTS`` switch) and lm-eval's ``git describe`` in the user's working folder (its record of
    the folder's commit, which an export drops, printed ``fatal: not a git repository`` outside one)."""
    import datasets
    from lm_eval import evaluator
    from lm_eval.loggers import utils

    def no_commit():
        return None

    with (mock.patch.object(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", False),
          mock.patch.object(evaluator, "get_git_commit_hash", no_commit),
          mock.patch.object(utils, "get_git_commit_hash", no_commit)):
        yield


def evaluate_folder(model_dir: str | Path, suites: list[str] = ("local",), tasks: list[str] | None = None,
                    output_dir: str | Path | None = None, batch_size: int | str = 8, device: str = "cpu",
                    dtype: str = "auto", limit: int | None = None, num_fewshot: int | None = None) -> dict[str, dict]:
    """Evaluate a model folder with lm-eval's own loader, ``HFLM(pretrained=folder, device, dtype,
    trust_remote_code=True)`` (so ``device`` and ``dtype`` are honoured), on each suite, or on ``tasks`` (any lm-eval
    task, the local ones included) instead. ``num_fewshot`` replaces the suites' own settings. Writes
    ``<name>.json`` (lm-eval's results) and ``<name>.md`` per suite (name "tasks" for ``tasks``) in ``output_dir``
    (default ``model_dir/eval``); returns {name: results}."""
    unknown = sorted(set(suites) - set(SUITES))
    if unknown:
        raise UserError(f"unknown suite {unknown[0]!r}; choose from {sorted(SUITES)}")
    with needs_extra("eval"):
        from lm_eval.models.huggingface import HFLM

    model_dir = Path(model_dir)
    require_causal_lm(model_dir)
    output_dir = results_folder(model_dir, output_dir)
    if tasks:
        runs = {"tasks": {"tasks": list(tasks), "num_fewshot": None}}
    else:
        runs = {suite: SUITES[suite] for suite in suites}
    language_model = HFLM(pretrained=str(model_dir), device=device, dtype=dtype, batch_size=batch_size,
                          trust_remote_code=True)
    windows_without_length_alarm(language_model)
    with tempfile.TemporaryDirectory() as local_tasks:  # data of the run, not of its results
        return _evaluate_runs(language_model, runs, str(write_local_tasks(local_tasks)), output_dir, batch_size,
                              device, limit, num_fewshot)


def results_folder(model_dir: Path, output_dir: str | Path | None) -> Path:
    """Where the results of ``model_dir`` go: ``output_dir``, by default ``model_dir/eval``, or beside an exported
    folder (``EXPORT-eval``), which they may not enter (`files.is_export`)."""
    if not is_export(model_dir):
        return Path(output_dir) if output_dir is not None else model_dir / "eval"
    if output_dir is None:
        return model_dir.parent / f"{model_dir.name}-eval"
    if model_dir.resolve() in [Path(output_dir).resolve(), *Path(output_dir).resolve().parents]:
        raise UserError(f"--output-dir {output_dir} lies in the exported folder {model_dir}, which is uploaded as "
                        "export wrote it: choose a folder outside it (default: beside it)")
    return Path(output_dir)


def _evaluate_runs(language_model, runs: dict, local_tasks: str, output_dir: Path, batch_size, device: str,
                   limit: int | None, num_fewshot: int | None) -> dict[str, dict]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    evaluated = {}
    for name, settings in runs.items():
        manager = TaskManager(include_path=local_tasks, include_defaults=name != "local")
        online = [task for task in settings["tasks"] if not task.startswith(LOCAL_TASK_PREFIX)]
        asked = f"--tasks {' '.join(online)}" if name == "tasks" else f"--suite {name}"
        reached = reaching_hub(asked, "evaluate offline with --suite local") if online else nullcontext()
        with reached, unasked_lookups_off(), labelled_progress():
            results = lm_eval.simple_evaluate(
                model=language_model, tasks=settings["tasks"], task_manager=manager, limit=limit, log_samples=False,
                num_fewshot=settings["num_fewshot"] if num_fewshot is None else num_fewshot)
        results = json.loads(json.dumps(results, default=str))  # lm-eval's numpy / dtype values as JSON
        results["config"].update(batch_size=batch_size, device=device)  # lm-eval leaves them out for a model object
        output_dir.mkdir(parents=True, exist_ok=True)  # once there is a result: a failed run leaves no empty folder
        (output_dir / f"{name}.json").write_text(json.dumps(results, indent=2))
        (output_dir / f"{name}.md").write_text(format_results_table(results) + "\n")
        evaluated[name] = results
    return evaluated
