"""The `energyzoo` command: `energyzoo quickstart | train | eval | export | recipes | bench | doctor | reproduce`.

Bad input (a recipe or preset name, an override, a folder, a config key) is answered in one line,
``energyzoo <command>: error: <message>``, with exit code 2; ``--debug`` shows the traceback instead. Modules load
after the arguments are parsed, so ``--help`` answers at once.
"""

import argparse
import json
import sys

# bad values and types, missing files and folders (the library's own errors name the field or input)
USER_ERRORS = (ValueError, TypeError, OSError, ImportError)


def _quickstart(args) -> int:
    from .quickstart import run_quickstart

    report = run_quickstart(args.output_dir, steps=args.steps)
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
    print(f"push it with    energyzoo export {report.export_dir.parent / 'train' / 'model'} {report.export_dir} "
          "--push <user>/<name>")
    return 0


def _train(args) -> int:
    from .training.recipe import load_recipe
    from .training.run import run_training

    recipe = load_recipe(args.recipe, args.overrides)
    result = run_training(recipe, resume=args.resume, overwrite=args.overwrite, stop_after=args.stop_after)
    if result.model_dir is None:
        print(f"stopped after step {result.last_step}; continue with --resume")
    else:
        print(f"trained {result.last_step} steps; {result.final_metrics}; model in {result.model_dir}")
    return 0


def _eval(args) -> int:
    from .eval.harness import evaluate_folder, format_results_table
    from .training.run import model_folder

    folder = model_folder(args.model_dir, args.checkpoint)
    _available_device(args.device)
    for name, results in evaluate_folder(folder, suites=args.suite, tasks=args.tasks, output_dir=args.output_dir,
                                         batch_size=args.batch_size, device=args.device, dtype=args.dtype,
                                         limit=args.limit, num_fewshot=args.num_fewshot).items():
        print(f"\n{name} ({folder}):\n{format_results_table(results)}")
    return 0


def _export(args) -> int:
    from .hub_cards import export_folder
    from .training.run import model_folder

    source = model_folder(args.model_dir, args.checkpoint)
    folder = export_folder(source, args.output_dir, push_to=args.push, private=args.private)
    print(f"exported {source} to {folder}")
    if args.push:
        print(f"uploaded to https://huggingface.co/{args.push}")
    else:
        print(f"push it with: energyzoo export {args.model_dir} {folder} --push <user>/<name>")
    return 0


def _recipes(args) -> int:
    from .training.recipe_files import shipped_recipes

    recipes = shipped_recipes()
    print("shipped recipes (energyzoo train NAME [section.key=value ...]):")
    width = max(len(name) for name in recipes)
    for name, (summary, _) in recipes.items():
        print(f"  {name:<{width}}  {summary}")
    folder = next(iter(recipes.values()))[1].parent
    print(f"\nrecipes and accelerate configs live in {folder}")
    print(f"  accelerate launch --config_file {folder / 'accelerate-fsdp.yaml'} -m energyzoo.cli train fem-lm-340m")
    return 0


def _print_and_save(table: str, result: dict, output: str) -> None:
    print(table)
    if output:
        with open(output, "w") as handle:
            json.dump(result, handle, indent=2)
        print(f"saved {output}")


def _available_device(name: str) -> str:
    """``name`` if this torch can run on that device, else a one-line `ValueError`."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"--device {name!r} is no torch device ({str(error).split(':')[0]})") from None
    accelerator = getattr(torch, device.type, None)
    if device.type != "cpu" and not (accelerator is not None and accelerator.is_available()):
        raise ValueError(f"--device {name}: this torch ({torch.__version__}) has no {device.type} device")
    return name


def _bench(args) -> int:
    from .eval.speed import (
        BenchSettings,
        format_eqt_table,
        format_scaling_table,
        format_table,
        format_tel_table,
        run_eqt_vs_llama,
        run_fem_vs_llama,
        run_length_scaling,
        run_tel_vs_vanilla,
    )

    _available_device(args.device)
    if args.tel:
        result = run_tel_vs_vanilla(batch_size=args.batch_size, seq_len=args.seq_len, repeats=args.repeats,
                                    device=args.device)
        _print_and_save(format_tel_table(result), result, args.output)
        return 0
    if args.eqt:
        result = run_eqt_vs_llama(args.preset or "eqt-llama-340m", steps=tuple(args.steps),
                                  batch_size=args.batch_size, seq_len=args.seq_len, repeats=args.repeats,
                                  device=args.device)
        _print_and_save(format_eqt_table(result), result, args.output)
        return 0
    if args.scaling:
        result = run_length_scaling(args.preset or "fem-lm-tiny",
                                    priors=tuple(args.priors), repeats=args.repeats, device=args.device)
        _print_and_save(format_scaling_table(result), result, args.output)
        return 0
    preset = {"preset": args.preset} if args.preset else {}
    settings = BenchSettings(**preset, baseline=args.baseline, batch_size=args.batch_size,
                             seq_len=args.seq_len, repeats=args.repeats, device=args.device, dtype=args.dtype,
                             compile=args.compile, prior=args.prior, kernel=args.kernel,
                             attn_implementation=args.attn_implementation)
    result = run_fem_vs_llama(settings)
    _print_and_save(format_table(result), result, args.output)
    return 0


def _doctor(args) -> int:
    from dataclasses import asdict

    from .eval.kernels import format_doctor_table, run_doctor

    checks = run_doctor(args.device, tuple(args.dtypes))
    _print_and_save(format_doctor_table(checks, args.device), [asdict(check) for check in checks], args.output)
    counts = {status: sum(check.status == status for check in checks) for status in ("pass", "FAIL")}
    print(f"{counts['pass']} passed, {counts['FAIL']} failed, {len(checks) - sum(counts.values())} not run")
    return 1 if counts["FAIL"] else 0


def _reproduce(args) -> int:
    if args.experiment == "hyperset":
        from .reproduce.hyperset import HypersetSettings, format_markdown, run_hyperset, write_report

        settings = HypersetSettings(sudoku_steps=args.sudoku_steps, classification_steps=args.classification_steps,
                                    maskgit_steps=args.maskgit_steps)
        output_dir = args.output_dir or "runs/hyperset"
        report = run_hyperset(settings, output_dir)
    elif args.experiment == "eer-induction":
        from .reproduce.eer_induction import InductionSettings, format_markdown, run_induction, write_report

        settings = InductionSettings(seeds=list(range(args.induction_seeds)), steps=args.induction_steps,
                                     eval_every=args.induction_eval_every)
        output_dir = args.output_dir or "runs/eer-induction"
        report = run_induction(settings, output_dir)
    elif args.experiment == "eqt-parity":
        from .reproduce.eqt_parity import ParitySettings, format_markdown, run_parity, write_report

        settings = ParitySettings(lengths=args.lengths, seeds=list(range(args.parity_seeds)), steps=args.parity_steps)
        output_dir = args.output_dir or "runs/eqt-parity"
        report = run_parity(settings, output_dir)
    else:
        from .reproduce.tel_stage1 import StageOneSettings, format_markdown, run_stage_one, write_report

        settings = StageOneSettings(datasets=tuple(args.datasets), widths=tuple(args.widths), seeds=args.seeds,
                                    epochs=args.epochs)
        output_dir = args.output_dir or "runs/tel-stage1"
        report = run_stage_one(settings)
    paths = write_report(report, output_dir)
    print(format_markdown(report))
    print(f"\n{report['seconds']:.0f} s; wrote " + ", ".join(str(path) for path in paths.values()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="energyzoo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)

    quickstart = commands.add_parser("quickstart", help="train, evaluate and export a tiny FEM-LM (offline)")
    quickstart.add_argument("--output-dir", default="runs/quickstart")
    quickstart.add_argument("--steps", type=int, default=500)
    quickstart.set_defaults(run=_quickstart)

    train = commands.add_parser("train", help="train a zoo model from a recipe with accelerate")
    train.add_argument("recipe", help="a recipe YAML file, or the name of one in energyzoo/configs (e.g. fem-lm-tiny)")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. training.steps=20 output_dir=runs/x")
    start = train.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue the run in output_dir from its newest complete checkpoint (the recipe's "
                            "settings must be the run's)")
    start.add_argument("--overwrite", action="store_true",
                       help="start over in an output_dir that holds a run, removing that run's files")
    train.add_argument("--stop-after", type=int, default=None,
                       help="stop this session after N steps without a final save (resume later with --resume)")
    train.set_defaults(run=_train)

    evaluate = commands.add_parser(
        "eval", help="lm-evaluation-harness on a model folder",
        description="lm-evaluation-harness (its HFLM, loading the folder with trust_remote_code) on a model folder, a "
                    "run folder's checkpoint or an exported folder. Data-parallel evaluation on several GPUs: "
                    "accelerate launch -m lm_eval --model hf --model_args pretrained=FOLDER,trust_remote_code=True "
                    "--tasks ...")
    evaluate.add_argument("model_dir", help="a model folder, or a run folder with --checkpoint")
    evaluate.add_argument("--checkpoint", default=None,
                          help="an intermediate checkpoint of the run: step-N or a checkpoint folder")
    evaluate.add_argument("--suite", nargs="+", default=["local"], choices=["local", "general", "leaderboard"],
                          help="local: offline tasks shipped with energyzoo; general / leaderboard download datasets")
    evaluate.add_argument("--tasks", nargs="+", default=None,
                          help="lm-eval task names instead of the suites (results in OUTPUT/tasks.json)")
    evaluate.add_argument("--num-fewshot", type=int, default=None, help="default: each suite's own setting")
    evaluate.add_argument("--output-dir", default=None, help="default: MODEL_DIR/eval")
    evaluate.add_argument("--batch-size", default="8", help="an integer, or 'auto' (lm-eval finds the largest)")
    evaluate.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps, ...")
    evaluate.add_argument("--dtype", default="auto", help="auto (the saved dtype), float32, bfloat16 or float16")
    evaluate.add_argument("--limit", type=int, default=None, help="at most this many documents per task")
    evaluate.set_defaults(run=_eval)

    export = commands.add_parser("export", help="write a Hub-ready folder (remote code, tokenizer, model card)")
    export.add_argument("model_dir", help="a model folder, or a run folder with --checkpoint")
    export.add_argument("output_dir")
    export.add_argument("--checkpoint", default=None,
                        help="an intermediate checkpoint of the run: step-N or a checkpoint folder")
    export.add_argument("--push", default=None, metavar="REPO_ID", help="upload the folder to this Hub repository")
    export.add_argument("--private", action="store_true")
    export.set_defaults(run=_export)

    recipes = commands.add_parser("recipes", help="list the shipped recipes and where the accelerate configs are")
    recipes.set_defaults(run=_recipes, loads_models=False)

    bench = commands.add_parser("bench", help="FEM-LM vs its Llama baseline: forward, train step, peak memory")
    bench.add_argument("--preset", default=None,
                       help="FEM preset (default: the registry's FEM bench preset, fem.txt Table 5 shape)")
    bench.add_argument("--baseline", default=None, help="Llama preset (default: the preset card's baseline)")
    bench.add_argument("--batch-size", type=int, default=4)
    bench.add_argument("--seq-len", type=int, default=1024)
    bench.add_argument("--repeats", type=int, default=9)
    bench.add_argument("--device", default="cpu")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    bench.add_argument("--output", default="bench.json", help="JSON file for the results ('' to skip)")
    bench.add_argument("--prior", default=None, choices=["softmax", "gla", "aft", "ssm"],
                       help="FEM's prior (default: the preset's)")
    bench.add_argument("--kernel", default="auto", choices=["auto", "torch", "fla", "mamba"],
                       help="FEMConfig.kernel: auto (the GPU kernel libraries on CUDA when installed), torch, fla "
                            "(GLA prior), mamba (SSM prior)")
    bench.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "flash_attention_2"],
                       help="the baseline's and FEM softmax prior's attention (flash_attention_2 needs --dtype "
                            "bfloat16)")
    bench.add_argument("--compile", action="store_true",
                       help="compile both models' forward with torch.compile (inductor) before timing")
    bench.add_argument("--scaling", action="store_true",
                       help="instead: forward time at T=1024 vs T=4096 per prior (default preset fem-lm-tiny)")
    bench.add_argument("--priors", nargs="+", default=["softmax", "gla", "aft", "ssm"], help="priors for --scaling")
    bench.add_argument("--tel", action="store_true",
                       help="instead: TEL-head and TEL-full GPT-2 (124M) vs GPT-2 forward time (e.g. --batch-size 2"
                            " --seq-len 512)")
    bench.add_argument("--eqt", action="store_true",
                       help="instead: EqT-LLaMA (default eqt-llama-340m) at each K of --steps vs its base Llama, "
                            "inference forward (e.g. --batch-size 1 --seq-len 512)")
    bench.add_argument("--steps", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16], help="K values for --eqt")
    bench.set_defaults(run=_bench)

    doctor = commands.add_parser("doctor", help="check the GPU kernels (fla, mamba-ssm, flash-attn) against the "
                                                "PyTorch path, forward, backward and cached decoding")
    doctor.add_argument("--device", default="cuda")
    doctor.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    doctor.add_argument("--output", default="", help="JSON file for the results (default: none)")
    doctor.set_defaults(run=_doctor)

    reproduce = commands.add_parser("reproduce", help="a CPU-scale rerun of a paper experiment, with a report")
    reproduce.add_argument("experiment", choices=["tel-stage1", "hyperset", "eqt-parity", "eer-induction"],
                           help="tel-stage1: tel.txt Stage I, Linear vs MLP vs TEL at matched width; hyperset: "
                                "Sudoku test-time scaling, digits vs a matched ViT, energy curves; eqt-parity: EqT vs "
                                "Llama on cumulative parity; eer-induction: EER vs cross-entropy on induction heads, "
                                "trained at L 16-64, evaluated at L 10 / 100 / 1000")
    reproduce.add_argument("--output-dir", default=None, help="default: runs/<experiment>")
    reproduce.add_argument("--datasets", nargs="+", default=["digits", "wine", "diabetes", "swiss_roll", "s_curve"])
    reproduce.add_argument("--widths", nargs="+", type=int, default=[16, 64, 256])
    reproduce.add_argument("--seeds", type=int, default=5)
    reproduce.add_argument("--epochs", type=int, default=60)
    reproduce.add_argument("--sudoku-steps", type=int, default=2000, help="hyperset: Sudoku training steps")
    reproduce.add_argument("--classification-steps", type=int, default=2000, help="hyperset: digits training steps")
    reproduce.add_argument("--maskgit-steps", type=int, default=1500, help="hyperset: MaskGIT training steps")
    reproduce.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64], help="eqt-parity: lengths L")
    reproduce.add_argument("--parity-seeds", type=int, default=3, help="eqt-parity: seeds per length")
    reproduce.add_argument("--parity-steps", type=int, default=600, help="eqt-parity: training steps per model")
    reproduce.add_argument("--induction-seeds", type=int, default=3, help="eer-induction: seeds per loss")
    reproduce.add_argument("--induction-steps", type=int, default=3000,
                           help="eer-induction: training steps per model (the paper: 20000)")
    reproduce.add_argument("--induction-eval-every", type=int, default=500,
                           help="eer-induction: steps between evaluations at L = 10, 100, 1000")
    reproduce.set_defaults(run=_reproduce)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "loads_models", True):
            from .registry import register_all  # the first import of torch and transformers

            register_all()
        return args.run(args)
    except USER_ERRORS as error:
        if args.debug:
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"energyzoo {args.command}: error: {message} (--debug for the traceback)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
