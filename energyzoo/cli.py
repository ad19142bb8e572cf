"""The `energyzoo` command: `energyzoo quickstart | train | eval | export | convert | recipes | bench | doctor |
reproduce`.

Bad input (a recipe or preset name, an override, a folder or a damaged file in it, a config key, a mistyped choice)
is answered in one line, ``energyzoo <command>: error: <message>``, with exit code 2; ``--debug`` shows the traceback
instead. Modules load after the arguments are parsed and the files a verb reads are checked (its ``check_files``),
so ``--help``, a typo and a missing or damaged folder answer at once.
"""

import argparse
import json
import logging
import os
import shlex
import sys
import textwrap
import traceback
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

from .files import write_fault
from .modeling.errors import MissingExtra, UntestedTransformers, UserError, did_you_mean
from .reproduce.experiments import EXPERIMENTS  # a table of names: no torch before the arguments are parsed

# What the user can fix: energyzoo's own checks (they name the field, file or input), a transformers release outside
# the tested range, a file the user may not read or write. Anything else is a bug in energyzoo.
USER_ERRORS = (UserError, UntestedTransformers, MissingExtra, PermissionError)
BUG_REPORT = "this is a bug in energyzoo, not in your input: please report it with the traceback above"


class ReadWhenUsed(Sequence):
    """Argument choices read from energyzoo's tables the first time they are checked or shown: the tables import torch,
    which the commands that never read them (recipes, argument errors, the top-level --help) do without. An
    argument that has them names a metavar, so that a usage line does not read them either."""

    def __init__(self, read):
        self._read = read

    @cached_property
    def _choices(self) -> tuple[str, ...]:
        return tuple(self._read())

    def __getitem__(self, index):
        return self._choices[index]

    def __len__(self) -> int:
        return len(self._choices)


class OneLineParser(argparse.ArgumentParser):
    """argparse answering a bad argument in one line, ``energyzoo VERB: error: ...`` (exit code 2), as energyzoo's own
    checks do: a value outside an argument's choices names the closest choice and where every one is listed (the
    verb's --help), instead of a line of every name; ``epilog_when_shown`` (a function) writes the help's closing
    text when the help is shown, so that tables it lists load only then."""

    def __init__(self, *args, epilog_when_shown=None, intermixed=False, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # a prefix of an option is a typo (--resum), not the option
        super().__init__(*args, **kwargs)
        self.epilog_when_shown = epilog_when_shown
        self.intermixed = intermixed
        self._intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        """With ``intermixed``, positional overrides may come before, between or after the flags (argparse's
        intermixed parsing, whose two passes call this method again)."""
        if not self.intermixed or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def refuse_unrecognized(self, extras: list[str]) -> None:
        """One line for arguments the verb does not take, naming the closest option of a mistyped flag."""
        flags = [option for action in self._actions for option in action.option_strings]
        first = extras[0]
        hint = did_you_mean(first.partition("=")[0], flags) if first.startswith("--") else ""
        self.error(f"unrecognized argument{'s' * (len(extras) > 1)}: {' '.join(extras)}{hint}")

    def _check_value(self, action, value):  # argparse's one check of a value against ``choices``
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, f"{value!r} is not one{did_you_mean(value, action.choices)} "
                                                 f"({self.prog} --help lists every one)")

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help for the usage)\n"
                  if "--help" not in message else f"{self.prog}: error: {message}\n")

    def format_help(self) -> str:
        if self.epilog_when_shown is not None:
            self.epilog = self.epilog_when_shown()
        return super().format_help()


def _bench_names() -> list[str]:
    from .bench.speed import benched_architectures
    from .presets import preset_names

    return [*benched_architectures(), *preset_names()]


def _grouped(title: str, names) -> str:
    """``names`` as lines grouped by family (the first word), under ``title``: the list a typo's answer points to."""
    families: dict[str, list[str]] = {}
    for name in names:
        families.setdefault(name.split("-")[0], []).append(name)
    return "\n".join([title, *(textwrap.fill(", ".join(members), width=100, initial_indent=f"  {family}: ",
                                              subsequent_indent="    ", break_on_hyphens=False)
                                for family, members in families.items())])


def _bench_epilog() -> str:
    from .bench.speed import benched_architectures
    from .presets import preset_names

    return (_grouped("NAME, an architecture (its bench entry's presets):", benched_architectures()) + "\n\n"
            + _grouped("NAME, a preset (energyzoo/presets/<NAME>.json):", preset_names()))


def _reproduce_epilog() -> str:
    return _grouped("experiments (reproduce/experiments.py):", EXPERIMENTS)


def _suites() -> list[str]:
    from .eval.suites import SUITES

    return list(SUITES)


def _workloads(timed_only: bool = False) -> list[str]:
    from .bench.table import TIMED, WORKLOADS

    return list(TIMED if timed_only else WORKLOADS)


def _quickstart_verb(commands) -> None:
    quickstart = commands.add_parser("quickstart", help="train, evaluate and export a tiny FEM-LM (offline)")
    quickstart.add_argument("--output-dir", default="runs/quickstart")
    quickstart.add_argument("--steps", type=at_least_one, default=500)
    quickstart.add_argument("--overwrite", action="store_true",
                            help="replace an earlier quickstart in OUTPUT_DIR (kept until the new one is whole)")
    quickstart.set_defaults(run=_quickstart, check_files=_quickstart_folder)


def _quickstart_folder(args) -> None:
    from .quickstart import check_quickstart_folder

    check_quickstart_folder(Path(args.output_dir), args.overwrite)


def _quickstart(args) -> int:
    from .quickstart import run_quickstart

    report = run_quickstart(args.output_dir, steps=args.steps, overwrite=args.overwrite)
    mc = report.local_results["energyzoo_pydoc_mc"]
    ppl = report.local_results["energyzoo_pydoc_ppl"]
    print(f"\ntrain loss      {report.train_loss:.3f}  (last 20 steps)")
    print(f"validation loss {report.validation_loss:.3f}  perplexity {report.validation_perplexity:.1f}"
          f"  (uniform over the vocabulary: {report.uniform_loss:.3f})")
    print(f"local eval      pydoc_mc acc {mc['acc']:.3f} (chance 0.25), pydoc_ppl bits/byte {ppl['bits_per_byte']:.3f}")
    print(f"sample          {report.sample!r}")
    print(f"energy plot     {report.energy_plot}  (free-energy gain and temperature per layer)")
    print(f"exported to     {report.export_dir}  ({report.seconds:.0f} s)")
    print(f"load it with    AutoModelForCausalLM.from_pretrained({str(report.export_dir)!r}, trust_remote_code=True)")
    folders = " ".join(shlex.quote(str(folder)) for folder in (report.model_dir, report.export_dir))
    print(f"push it with    energyzoo export {folders} --push <user>/<name>")
    return 0


def at_least_one(text: str) -> int:
    """An argument that counts steps: a whole number >= 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(text)


def _recipe_and_overrides(args) -> None:
    """The recipe file and its overrides read (keys and types) before torch loads: a typo answers at once."""
    from .training.recipe import read_recipe
    from .training.recipe_files import recipe_file

    read_recipe(recipe_file(args.recipe), args.overrides)


def _train_verb(commands) -> None:
    train = commands.add_parser("train", help="train a zoo model from a recipe with accelerate", intermixed=True)
    train.add_argument("recipe", help="a recipe YAML file, or the name of one in energyzoo/recipes (e.g. fem-lm-tiny)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.steps=20 output_dir=runs/x")
    start = train.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue the run in output_dir from its newest complete checkpoint (the recipe's "
                            "settings must be the run's)")
    start.add_argument("--overwrite", action="store_true",
                       help="start over in an output_dir that holds a run, removing that run's files")
    train.add_argument("--stop-after", type=at_least_one, default=None, metavar="N",
                       help="stop this session after N more steps (N >= 1), saving a checkpoint of the step it "
                            "reached (continue with --resume)")
    train.set_defaults(run=_train, check_files=_recipe_and_overrides)


def _train(args) -> int:
    from accelerate import PartialState

    from .training.recipe import load_recipe
    from .training.run import run_training

    recipe = load_recipe(args.recipe, args.overrides)
    result = run_training(recipe, resume=args.resume, overwrite=args.overwrite, stop_after=args.stop_after)
    if not PartialState().is_main_process:  # under accelerate launch, one process reports
        return 0
    if result.model_dir is None:
        print(f"stopped after step {result.last_step} ({result.engine.describe()}); continue with --resume")
    else:
        metrics = ", ".join(f"{name.removeprefix('validation_').replace('_', ' ')} {value:.4g}"
                            for name, value in result.final_metrics.items())
        print(f"trained {result.last_step} steps ({result.engine.describe()}); validation: {metrics}; model in "
              f"{result.model_dir}")
    return 0


def _model_folder_arguments(verb) -> None:
    """The model folder a verb reads (eval, export): a folder, or a run folder's checkpoint."""
    verb.add_argument("model_dir", help="a model folder, or a run folder with --checkpoint")
    verb.add_argument("--checkpoint", default=None,
                      help="an intermediate checkpoint of the run: step-N or a checkpoint folder")


def _model_folder(args) -> Path:
    """The verb's model folder, checked once (`files.model_folder`: every file of it read)."""
    from .files import model_folder

    if getattr(args, "checked_folder", None) is None:
        args.checked_folder = model_folder(args.model_dir, args.checkpoint)
    return args.checked_folder


def _eval_verb(commands) -> None:
    evaluate = commands.add_parser(
        "eval", help="lm-evaluation-harness on a model folder",
        description="lm-evaluation-harness (its HFLM, loading the folder with trust_remote_code) on a model folder, a "
                    "run folder's checkpoint or an exported folder. Data-parallel evaluation on several GPUs: "
                    "accelerate launch -m lm_eval --model hf --model_args pretrained=FOLDER,trust_remote_code=True "
                    "--tasks ...")
    _model_folder_arguments(evaluate)
    evaluate.add_argument("--suite", nargs="+", default=["local"], metavar="SUITE", choices=ReadWhenUsed(_suites),
                          help="local: offline tasks shipped with energyzoo; general / leaderboard download datasets")
    evaluate.add_argument("--tasks", nargs="+", default=None,
                          help="lm-eval task names instead of the suites (results in OUTPUT/tasks.json)")
    evaluate.add_argument("--num-fewshot", type=int, default=None, help="default: each suite's own setting")
    evaluate.add_argument("--output-dir", default=None,
                          help="default: MODEL_DIR/eval; for an exported folder, EXPORT-eval beside it")
    evaluate.add_argument("--batch-size", default="8", help="an integer, or 'auto' (lm-eval finds the largest)")
    evaluate.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps, ...")
    evaluate.add_argument("--dtype", default="auto", help="auto (the saved dtype), float32, bfloat16 or float16")
    evaluate.add_argument("--limit", type=int, default=None, help="at most this many documents per task")
    evaluate.set_defaults(run=_eval, check_files=_model_folder)


def _eval(args) -> int:
    from .eval.harness import evaluate_folder, format_results_table

    folder = _model_folder(args)
    _available_device(args.device)
    for name, results in evaluate_folder(folder, suites=args.suite, tasks=args.tasks, output_dir=args.output_dir,
                                         batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                                         limit=args.limit, num_fewshot=args.num_fewshot).items():
        print(f"\n{name} ({folder}):\n{format_results_table(results)}")
    return 0


def _export_verb(commands) -> None:
    export = commands.add_parser("export", help="write a Hub-ready folder (remote code, tokenizer, model card)")
    _model_folder_arguments(export)
    export.add_argument("output_dir")
    export.add_argument("--push", default=None, metavar="REPO_ID", help="upload the folder to this Hub repository")
    export.add_argument("--private", action="store_true")
    export.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export in OUTPUT_DIR whose files were edited since it was written")
    export.set_defaults(run=_export, check_files=_model_folder)


def _export(args) -> int:
    from .export import export_folder

    source = _model_folder(args)
    folder = export_folder(source, args.output_dir, push_to=args.push, private=args.private,
                           overwrite=args.overwrite)
    print(f"exported {source} to {folder}")
    if args.push:
        print(f"uploaded to https://huggingface.co/{args.push}")
    else:
        checkpoint = f" --checkpoint {shlex.quote(args.checkpoint)}" if args.checkpoint else ""
        print(f"push it with: energyzoo export {shlex.quote(args.model_dir)} {shlex.quote(str(folder))}{checkpoint} "
              "--push <user>/<name>")
    return 0


def _convert_verb(commands) -> None:
    convert = commands.add_parser(
        "convert", help="turn another codebase's checkpoint into a Hub-ready energyzoo folder",
        description="hyperset-original: an authors' Hyper-SET checkpoint (huyunzhe/hyper-set; .pt / .pth / "
                    ".safetensors; image classification, Sudoku or MaskGIT, read from its keys). What the state dict "
                    "cannot say comes from their task config (--config) or --set, in their names: n_recur, "
                    "input_cond, adaptive_mode, type, dataset or size, lora_alpha, attention, ff, phi_func, img_size; "
                    "else from the authors' shipped defaults, which the command lists.")
    convert.add_argument("format", choices=["hyperset-original"])
    convert.add_argument("source", help="the checkpoint file")
    convert.add_argument("output_dir")
    convert.add_argument("--config", default=None, help="the authors' Hydra config of the run (model and data keys)")
    convert.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                         help="one of the authors' options, e.g. --set n_recur=12 --set dataset=in1k")
    convert.add_argument("--overwrite", action="store_true",
                         help="replace an earlier conversion in OUTPUT_DIR whose files were edited since it was "
                              "written")
    convert.set_defaults(run=_convert, check_files=_convert_options)


def _convert_options(args) -> None:
    """The --set names checked against the authors' options before anything loads."""
    from .convert.hyperset_original_options import check_option_names

    args.options = _config_fields(args.set)
    check_option_names(args.options)


def _convert(args) -> int:
    from .convert.hyperset import convert_hyperset_original, original_options

    options = original_options(args.config, args.options)
    folder, task, defaults = convert_hyperset_original(args.source, args.output_dir, options,
                                                       overwrite=args.overwrite)
    print(f"converted the authors' {task} checkpoint {args.source} to {folder}")
    if defaults:
        print(f"not in the checkpoint and not given, the authors' defaults taken: {defaults}")
    return 0


def _recipes_verb(commands) -> None:
    recipes = commands.add_parser("recipes", help="list the shipped recipes and where the accelerate configs are")
    recipes.add_argument("--copy", default=None, metavar="NAME",
                         help="copy a shipped recipe and the example data it reads into --to, to edit there (the "
                              "own-text, own-jsonl and own-images recipes: training on your own files)")
    recipes.add_argument("--to", default=".", metavar="FOLDER", help="where --copy writes (default: here)")
    recipes.set_defaults(run=_recipes, loads_models=False)


def _recipes(args) -> int:
    from .training.recipe_files import ACCELERATE_CONFIGS, RECIPES, copy_recipe, shipped_recipes

    if args.copy is not None:
        for path in copy_recipe(args.copy, Path(args.to)):
            print(f"wrote {path}")
        return 0
    recipes = shipped_recipes()
    print("shipped recipes (energyzoo train NAME [section.key=value ...]):")
    width = max(len(name) for name in recipes)
    for name, (summary, _) in recipes.items():
        print(textwrap.fill(summary, width=118, break_on_hyphens=False, initial_indent=f"  {name:<{width}}  ",
                            subsequent_indent=" " * (width + 4)))
    print(f"\nrecipes live in {RECIPES}, accelerate configs in {ACCELERATE_CONFIGS}")
    print(f"  accelerate launch --config_file {ACCELERATE_CONFIGS / 'fsdp.yaml'} -m energyzoo.cli train fem-lm-340m")
    print("\nyour own data: energyzoo recipes --copy own-text (or own-jsonl, own-images) writes that recipe and its "
          "example files here, to edit (docs/training.md, \"Train on your own data\")")
    return 0


def _print_and_save(table: str, result: dict | list, output: str) -> None:
    print(table)
    if output:
        with open(output, "w") as handle:
            json.dump(result, handle, indent=2)
        print(f"saved {output}")


def _available_device(name: str, instead: str = "") -> str:
    """``name`` if this torch can run on that device, else a one-line `UserError` (saying ``instead``, what to run
    on this machine, where given)."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise UserError(f"--device {name!r} is no torch device ({str(error).split(':')[0]})") from None
    accelerator = getattr(torch, device.type, None)
    if device.type != "cpu" and not (accelerator is not None and accelerator.is_available()):
        raise UserError(f"--device {name}: this torch ({torch.__version__}) has no {device.type} device"
                        + (f"; {instead}" if instead else ""))
    return name


def _config_fields(assignments: list[str]) -> dict:
    """``FIELD=VALUE`` strings as config fields, each value read as YAML (``false``, ``64``, ``[1, 2]``)."""
    import yaml

    fields = {}
    for assignment in assignments:
        field, equals, value = assignment.partition("=")
        if not equals or not field:
            raise UserError(f"--set {assignment!r}: expected FIELD=VALUE, e.g. use_time_decay=false")
        fields[field] = yaml.safe_load(value)
    return fields


def _bench_verb(commands) -> None:
    bench = commands.add_parser(
        "bench", help="an architecture vs its baseline: forward, train step, peak memory, decoding",
        description="Time an architecture (the registry's bench entry: its presets, workloads and targets) or one "
                    "preset against the baseline of the same shape its card names, in one paired run.",
        epilog_when_shown=_bench_epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.add_argument("name", nargs="?", default=None, metavar="NAME", choices=ReadWhenUsed(_bench_names),
                       help="an architecture or a preset (e.g. fem-lm-table7); default fem")
    bench.add_argument("--all", action="store_true",
                       help="every architecture against its baseline, one table each (the entries' own shapes)")
    bench.add_argument("--baseline", default=None, help="baseline preset (default: the one the presets' cards name)")
    bench.add_argument("--batch-size", type=int, default=None, help="default: the bench entry's")
    bench.add_argument("--seq-len", type=int, default=None, help="default: the bench entry's (language models)")
    bench.add_argument("--repeats", type=int, default=9)
    bench.add_argument("--device", default="cpu")
    bench.add_argument("--threads", type=int, default=1,
                       help="cores the run is pinned to, with as many torch threads (default 1: two back-to-back "
                            "runs then agree; 0 leaves the process's cores and threads as they are)")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    bench.add_argument("--output", default=None,
                       help="JSON file for the results (default: bench.json, with --profile profile.json; '' to skip)")
    bench.add_argument("--set", nargs="+", default=[], metavar="FIELD=VALUE",
                       help="config fields of the measured presets, never of the baseline (e.g. prior=gla "
                            "kernel=torch use_time_decay=false)")
    bench.add_argument("--workloads", nargs="+", default=None, metavar="WORKLOAD", choices=ReadWhenUsed(_workloads),
                       help="measure only these of the entry's workloads (e.g. decode decode_static)")
    bench.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "flash_attention_2"],
                       help="the baseline's and FEM softmax prior's attention (flash_attention_2 needs --dtype "
                            "bfloat16)")
    bench.add_argument("--compile", action="store_true",
                       help="compile every model's forward with torch.compile (inductor) before timing")
    bench.add_argument("--sweep", type=int, nargs="+", default=None,
                       help="values of the entry's swept forward keyword or length (eqt-llama: refinement steps K, "
                            "default 0 1 2 4 8 16; fem: seq_len, default 1024 4096)")
    bench.add_argument("--profile", default=None, metavar="WORKLOAD",
                       choices=ReadWhenUsed(lambda: _workloads(timed_only=True)),
                       help="instead: torch.profiler's top operators of one call of WORKLOAD per model (where the "
                            "time goes)")
    bench.add_argument("--offload", default=None, metavar="MEMORY",
                       help="instead: a language-model preset with random weights, loaded whole and with "
                            "device_map='auto', max_memory={'cpu': MEMORY} (e.g. 2GiB) and disk offload, in float32 "
                            "and --dtype, each in a fresh process: peak resident memory, and whether its greedy tokens "
                            "are the whole model's (docs/big-models.md)")
    bench.set_defaults(run=_bench)


def _bench(args) -> int:
    from .bench.speed import BenchSettings, benched_architectures, profile_split, run_bench
    from .bench.table import format_table, profile_table

    _available_device(args.device)
    overrides = _config_fields(args.set)
    settings = BenchSettings(batch_size=args.batch_size, seq_len=args.seq_len, repeats=args.repeats,
                             device=args.device, dtype=args.dtype, compile=args.compile,
                             threads=args.threads or None,
                             attn_implementation=args.attn_implementation, overrides=overrides,
                             workloads=tuple(args.workloads) if args.workloads else None)
    if args.offload:
        return _offload_bench(args)
    if args.profile:
        if args.all:
            raise UserError("--profile takes one NAME, not --all")
        result = profile_split(args.name or "fem", args.profile, settings, baseline=args.baseline)
        output = "profile.json" if args.output is None else args.output
        _print_and_save(f"{result['tables']}\n\n{profile_table(result)}", result, output)
        return 0
    output = "bench.json" if args.output is None else args.output
    if args.all:
        if args.name or args.baseline or args.sweep:
            raise UserError("--all benches every architecture against its own baseline: drop NAME, --baseline "
                             "and --sweep")
        results = [run_bench(name, settings) for name in benched_architectures()]
        _print_and_save("\n\n".join(format_table(result) for result in results), results, output)
        return 0
    result = run_bench(args.name or "fem", settings, baseline=args.baseline,
                       sweep=tuple(args.sweep) if args.sweep else None)
    _print_and_save(format_table(result), result, output)
    return 0


def _offload_bench(args) -> int:
    from .bench.offload import format_offload_table, run_offload_bench
    from .presets import preset_card, preset_names

    if args.all or args.name not in preset_names() or preset_card(args.name)["task"] != "causal-lm":
        raise UserError("--offload takes one language-model preset as NAME (e.g. fem-lm-1.3b)")
    dtypes = tuple(dict.fromkeys(("float32", args.dtype)))
    result = run_offload_bench(args.name, args.offload, dtypes)
    _print_and_save(format_offload_table(result), result, "offload.json" if args.output is None else args.output)
    return 0


def _doctor_verb(commands) -> None:
    doctor = commands.add_parser("doctor", help="check the GPU kernels (fla, mamba-ssm, flash-attn) against the "
                                                "PyTorch path, forward, backward and cached decoding; with "
                                                "--families, every family on the device against float64")
    doctor.add_argument("--device", default="cuda")
    doctor.add_argument("--dtypes", nargs="+", default=None, choices=["float32", "float16", "bfloat16"],
                        help="default: float32 and bfloat16 (kernels), all three (--families)")
    doctor.add_argument("--families", action="store_true",
                        help="every family and head in each dtype against float64 on the CPU: outputs, gradients, "
                             "cached decoding (energyzoo/bench/families.py)")
    doctor.add_argument("--output", default="", help="JSON file for the results (default: none)")
    doctor.set_defaults(run=_doctor)


ON_CPU = "energyzoo doctor --families --device cpu (every family against float64, about 6 minutes on 2 cores)"


def _doctor(args) -> int:
    from dataclasses import asdict

    if args.families:
        from .bench.families import TOLERANCE, format_family_table, run_family_checks

        _available_device(args.device, f"on this CPU: {ON_CPU}")

        def said(check) -> None:  # a row at a time: the CPU check takes minutes
            print(f"{check.preset} {check.dtype}: {check.status} ({check.seconds:.0f} s)", file=sys.stderr, flush=True)

        checks = run_family_checks(args.device, tuple(args.dtypes or TOLERANCE), on_row=said)
        table = format_family_table(checks, args.device)
    else:
        from .bench.kernels import TOLERANCE, format_doctor_table, run_doctor

        if args.device == "cpu" or not args.device.startswith("cuda"):
            raise UserError(f"--device {args.device}: the kernel checks compare fla, mamba-ssm and flash-attn's CUDA "
                            f"kernels with the PyTorch path on a GPU (--device cuda); on a CPU: {ON_CPU}")
        _available_device(args.device, f"the kernel checks need a GPU; on this CPU: {ON_CPU}")
        if unchecked := sorted(set(args.dtypes or ()) - set(TOLERANCE)):
            raise UserError(f"--dtypes {' '.join(unchecked)}: the kernels are checked in {' and '.join(TOLERANCE)} "
                            "(--families checks every dtype)")
        checks = run_doctor(args.device, tuple(args.dtypes or TOLERANCE))
        table = format_doctor_table(checks, args.device)
    _print_and_save(table, [asdict(check) for check in checks], args.output)
    passed = sum(check.status == "pass" for check in checks)
    failed = sum(check.status.startswith("FAIL") for check in checks)
    print(f"{passed} passed, {failed} failed, {len(checks) - passed - failed} not run")
    return 1 if failed else 0


def _setting(args) -> str:
    if args.quick and args.paper_scale:
        raise UserError("--quick and --paper-scale are two settings: give one")
    return "quick" if args.quick else "paper-scale" if args.paper_scale else "full"


def _reproduce_verb(commands) -> None:
    reproduce = commands.add_parser(
        "reproduce", intermixed=True, help="a rerun of a paper experiment (CPU-scale, or --paper-scale), with a report",
        description="Run an experiment of the table in energyzoo/reproduce/experiments.py and write its report "
                    "(markdown, JSON, PNG). Settings are the fields of the experiment's settings class, overridden "
                    "as field=value (typed by the field: seeds=[0,1,2], max_epochs=30).",
        epilog_when_shown=_reproduce_epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    reproduce.add_argument("experiment", choices=["all", "ledger", *sorted(EXPERIMENTS)], help="all: every "
                           "experiment, then the ledger of their verdicts (an experiment whose report is in "
                           "<output-dir>/<name> from the same settings and code is not rerun); ledger: the ledger of "
                           "the reports in <output-dir>/<name>, running nothing; " + "; ".join(
                               f"{name}: {experiment.description}" for name, experiment in EXPERIMENTS.items()))
    reproduce.add_argument("overrides", nargs="*",
                           help="settings, e.g. seeds=3 max_epochs=30 (tel-stage1), sudoku_steps=400 (hyperset), "
                                "lengths=[16,32] seeds=[0,1,2] (eqt-parity), steps=1000 (eer-induction); for all: "
                                "NAME=SETTING, one experiment's setting in the ledger (e.g. fem-lm=quick)")
    reproduce.add_argument("--quick", action="store_true",
                           help="the quick setting: a smoke test of minutes on 2 CPU cores, no verdicts "
                                "(reproduce/experiments.py)")
    reproduce.add_argument("--paper-scale", action="store_true",
                           help="the paper's own scale (for a GPU; reproduce/experiments.py)")
    reproduce.add_argument("--output-dir", default=None,
                           help="default: runs/<experiment> (all and ledger: runs/reproduce)")
    reproduce.add_argument("--replay", action="store_true",
                           help="NAME: rerun the designated part of the report in --output-dir with this checkout's "
                                "code and record in it whether the numbers are the report's (a ledger then takes a "
                                "report of earlier code)")
    reproduce.add_argument("--keep-other-code", action="store_true",
                           help="ledger: keep reports whose experiment's code differs from this checkout's, marked "
                                "with the files that differ (refused otherwise)")
    reproduce.set_defaults(run=_reproduce)


def _reproduce(args) -> int:
    setting = _setting(args)
    if args.replay:
        return _reproduce_replay(args)
    if args.experiment == "ledger":
        return _reproduce_ledger(args)
    if args.keep_other_code:
        raise UserError("--keep-other-code belongs to `energyzoo reproduce ledger`: a run records its own code")
    if args.experiment == "all":
        return _reproduce_all(args, setting)
    return _reproduce_one(args, setting)


def _reproduce_ledger(args) -> int:
    """`reproduce ledger`: the ledger of the reports in the output folder, running nothing."""
    from .reproduce.report import build_ledger, ledger_markdown, read_reports, write_ledger

    output_dir = Path(args.output_dir or "runs/reproduce")
    if args.overrides:
        raise UserError(f"reproduce ledger runs nothing, so it takes no settings: got {' '.join(args.overrides)}")
    reports = read_reports(output_dir)
    if not reports:
        raise UserError(f"no report in {output_dir}/<name>/ (`energyzoo reproduce NAME --output-dir "
                        f"{output_dir}/NAME` writes one)")
    ledger = build_ledger(reports, "energyzoo reproduce ledger" + " --keep-other-code" * args.keep_other_code,
                          keep_other_code=args.keep_other_code)
    paths = write_ledger(ledger, output_dir)
    missing = [name for name in EXPERIMENTS if name not in reports]
    print(ledger_markdown(ledger))
    print("\nwrote " + ", ".join(map(str, paths.values())) + (
        f"; no report of {', '.join(missing)}" if missing else ""))
    return 0


def _reproduce_all(args, setting: str) -> int:
    """`reproduce all [NAME=SETTING ...]`: every experiment whose report is missing or stale, then the ledger."""
    from .reproduce.experiments import SETTINGS
    from .reproduce.report import build_ledger, ledger_markdown, run_experiment, write_ledger

    chosen = dict(override.partition("=")[::2] for override in args.overrides)
    for name, own in chosen.items():
        if name not in EXPERIMENTS or own not in SETTINGS:
            raise UserError(f"reproduce all takes NAME=SETTING (an experiment's setting in this ledger, one of "
                            f"{SETTINGS}), got {name}={own}: experiments are {', '.join(EXPERIMENTS)}; run "
                            f"`energyzoo reproduce NAME field=value` to change one's settings")
    output_dir = Path(args.output_dir or "runs/reproduce")
    reports = {name: run_experiment(name, [], output_dir / name, chosen.get(name, setting), reuse=True)
               for name in EXPERIMENTS}
    ledger = build_ledger(reports, command=" ".join(["energyzoo reproduce all", *args.overrides]
                                                    + [f"--{setting}"] * (setting != "full")))
    paths = write_ledger(ledger, output_dir)
    print(ledger_markdown(ledger))
    print("\nwrote " + ", ".join(str(path) for path in paths.values()) + f" and each experiment's report in "
          f"{output_dir}/<name>")
    return 0


def _reproduce_replay(args) -> int:
    """`reproduce NAME --replay`: the designated part of a report rerun with this checkout's code, recorded in it."""
    from .reproduce.report import replay_experiment

    if args.experiment in ("all", "ledger") or args.overrides or args.quick or args.paper_scale or args.keep_other_code:
        raise UserError("--replay reruns one experiment's report as it ran: give NAME and --output-dir, no settings")
    output_dir = args.output_dir or f"runs/{args.experiment}"
    replay = replay_experiment(args.experiment, output_dir)
    verdict = "equal to the report's" if replay["matches"] else "NOT the report's"
    print(f"{args.experiment} replayed ({' '.join(replay['overrides'])}) at {replay['code']['commit'][:7]}: "
          f"{verdict} (largest difference {replay['largest_difference']:.3g}, tolerance {replay['tolerance']:g}); "
          f"recorded in {output_dir}")
    return 0 if replay["matches"] else 1


def _reproduce_one(args, setting: str) -> int:
    """`reproduce NAME [field=value ...]`: one experiment and its report."""
    from .reproduce.report import run_experiment

    output_dir = args.output_dir or f"runs/{args.experiment}"
    report = run_experiment(args.experiment, args.overrides, output_dir, setting)
    print(EXPERIMENTS[args.experiment].code().format_markdown(report))
    print(f"\n{report['seconds']:.0f} s; wrote its markdown, JSON and PNG in {output_dir}")
    return 0


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to the ``sys.stderr`` of the moment (a test's capture replaces it between calls)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler sets it at construction: the property decides
        pass


def show_progress_lines() -> None:
    """energyzoo's own log lines (what a run read and decided: its data's size, its threads, a warning) on stderr, as
    ``energyzoo: ...``, once per process."""
    log = logging.getLogger("energyzoo")
    if not any(isinstance(handler, _CurrentStderr) for handler in log.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("energyzoo: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def quiet_libraries() -> None:
    """One progress bar at a time: the command's own (training steps, lm-eval's requests), not transformers' bars for
    every weight file it reads or writes, nor datasets' for every local split it builds."""
    import datasets
    import transformers

    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()


# the verbs in the order `energyzoo --help` lists them
VERBS = (_quickstart_verb, _train_verb, _eval_verb, _export_verb, _convert_verb, _recipes_verb, _bench_verb,
         _doctor_verb, _reproduce_verb)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="energyzoo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_verb in VERBS:
        add_verb(commands)
    for verb_parser in commands.choices.values():
        verb_parser.set_defaults(verb_parser=verb_parser)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # answered by the verb's parser, which names the verb and its closest option
        args.verb_parser.refuse_unrecognized(extras)
    show_progress_lines()
    try:
        if hasattr(args, "check_files"):  # the files it reads, before the model code loads (seconds)
            args.check_files(args)
        if getattr(args, "loads_models", True):
            from .registry import register_all  # the first import of torch and transformers

            register_all()
            quiet_libraries()
        return args.run(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"energyzoo {args.command}: error: {message} (--debug for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:  # Ctrl-C: what was written is whole (energyzoo writes folders whole)
        if args.debug:
            raise
        print(f"energyzoo {args.command}: {str(error) or 'stopped (Ctrl-C)'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader (head, less) closed the pipe: nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as error:  # noqa: BLE001 - shown whole, as what it is, unless the machine stopped a write
        if (fault := write_fault(error)) is not None and not args.debug:
            print(f"energyzoo {args.command}: error: cannot write {fault} (nothing half-written was left; --debug "
                  "for the traceback)", file=sys.stderr)
            return 2
        traceback.print_exc()
        print(f"energyzoo {args.command}: internal error: {BUG_REPORT}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
