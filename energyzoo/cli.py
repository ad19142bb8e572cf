"""The `energyzoo` command: `energyzoo quickstart | bench | reproduce`."""

import argparse
import json
import sys


def _quickstart(args) -> int:
    from .training.loop import LoopSettings
    from .training.quickstart import run_quickstart

    report = run_quickstart(args.output_dir, preset=args.preset, settings=LoopSettings(steps=args.steps))
    print(f"\ntrain loss      {report.train_loss:.3f}  (last 20 steps)")
    print(f"validation loss {report.validation_loss:.3f}  perplexity {report.validation_perplexity:.1f}"
          f"  (untrained: {report.initial_validation_loss:.3f})")
    print(f"sample          {report.sample!r}")
    print(f"saved to        {report.output_dir}  ({report.seconds:.0f} s)")
    print(f"load it with    AutoModelForCausalLM.from_pretrained({str(report.output_dir)!r})  (after `import energyzoo`,"
          " or with trust_remote_code=True)")
    return 0


def _print_and_save(table: str, result: dict, output: str) -> None:
    print(table)
    if output:
        with open(output, "w") as handle:
            json.dump(result, handle, indent=2)
        print(f"saved {output}")


def _bench(args) -> int:
    from .eval.speed import (
        BenchSettings,
        format_scaling_table,
        format_table,
        format_tel_table,
        run_fem_vs_llama,
        run_length_scaling,
        run_tel_vs_vanilla,
    )

    if args.tel:
        result = run_tel_vs_vanilla(batch_size=args.batch_size, seq_len=args.seq_len, repeats=args.repeats,
                                    device=args.device)
        _print_and_save(format_tel_table(result), result, args.output)
        return 0
    if args.scaling:
        result = run_length_scaling(args.preset if args.preset != "fem-lm-table5" else "fem-lm-tiny",
                                    priors=tuple(args.priors), repeats=args.repeats, device=args.device)
        _print_and_save(format_scaling_table(result), result, args.output)
        return 0
    settings = BenchSettings(preset=args.preset, baseline=args.baseline, batch_size=args.batch_size,
                             seq_len=args.seq_len, repeats=args.repeats, device=args.device, dtype=args.dtype)
    result = run_fem_vs_llama(settings)
    _print_and_save(format_table(result), result, args.output)
    return 0


def _reproduce(args) -> int:
    from .eval.tel_stage1 import StageOneSettings, format_markdown, run_stage_one, write_report

    settings = StageOneSettings(datasets=tuple(args.datasets), widths=tuple(args.widths), seeds=args.seeds,
                                epochs=args.epochs)
    report = run_stage_one(settings)
    paths = write_report(report, args.output_dir)
    print(format_markdown(report))
    print(f"\n{report['seconds']:.0f} s; wrote " + ", ".join(str(path) for path in paths.values()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="energyzoo", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    quickstart = commands.add_parser("quickstart", help="train a tiny FEM-LM on the embedded Python docs")
    quickstart.add_argument("--output-dir", default="runs/quickstart")
    quickstart.add_argument("--preset", default="fem-lm-tiny")
    quickstart.add_argument("--steps", type=int, default=500)
    quickstart.set_defaults(run=_quickstart)

    bench = commands.add_parser("bench", help="FEM-LM vs its Llama baseline: forward, train step, peak memory")
    bench.add_argument("--preset", default="fem-lm-table5", help="FEM preset (default: fem.txt Table 5 shape)")
    bench.add_argument("--baseline", default=None, help="Llama preset (default: the preset card's baseline)")
    bench.add_argument("--batch-size", type=int, default=4)
    bench.add_argument("--seq-len", type=int, default=1024)
    bench.add_argument("--repeats", type=int, default=9)
    bench.add_argument("--device", default="cpu")
    bench.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    bench.add_argument("--output", default="bench.json", help="JSON file for the results ('' to skip)")
    bench.add_argument("--scaling", action="store_true",
                       help="instead: forward time at T=1024 vs T=4096 per prior (default preset fem-lm-tiny)")
    bench.add_argument("--priors", nargs="+", default=["softmax", "gla", "aft", "ssm"], help="priors for --scaling")
    bench.add_argument("--tel", action="store_true",
                       help="instead: TEL-head and TEL-full GPT-2 (124M) vs GPT-2 forward time (e.g. --batch-size 2"
                            " --seq-len 512)")
    bench.set_defaults(run=_bench)

    reproduce = commands.add_parser("reproduce", help="a CPU-scale rerun of a paper experiment, with a report")
    reproduce.add_argument("experiment", choices=["tel-stage1"],
                           help="tel-stage1: tel.txt Stage I, Linear vs MLP vs TEL at matched width")
    reproduce.add_argument("--output-dir", default="runs/tel-stage1")
    reproduce.add_argument("--datasets", nargs="+", default=["digits", "wine", "diabetes", "swiss_roll", "s_curve"])
    reproduce.add_argument("--widths", nargs="+", type=int, default=[16, 64, 256])
    reproduce.add_argument("--seeds", type=int, default=5)
    reproduce.add_argument("--epochs", type=int, default=60)
    reproduce.set_defaults(run=_reproduce)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
