"""The zoo on one GPU in about ten minutes (`scripts/gpu_check.sh`): one report, its sections in priority order so that
a run cut short still says the most.

1. ``families``: every family and head in float32, float16 and bfloat16 against float64 on the CPU, with cached
   decoding (dynamic and static caches) for the language models (`families`).
2. ``kernels``: flash-attention 2, fla and mamba-ssm against the PyTorch path on the same weights (`kernels`,
   `energyzoo doctor`).
3. ``training``: `energyzoo train fem-lm-tiny` with validation on the GPU, then `energyzoo eval` of its model.
4. ``sharded``: the same recipe under FSDP2 and DeepSpeed ZeRO-3 (bf16, 2 micro-batches a step), once uninterrupted
   and once stopped after step 6 and resumed; the resumed model's weights against the uninterrupted one's.
5. ``compiled``: static-cache decoding compiled with CUDA graphs (transformers' `CompileConfig`) for each language
   model in bfloat16, against float64 on the CPU: a compile per model, so after everything cheaper.
6. ``bench``: `energyzoo bench` on the GPU: FEM against Llama with flash-attention 2 at fem.txt Table 7's shape, and
   every other family against its baseline.

After each section ``report.json`` and ``report.md`` in the output folder are rewritten. A section whose package is
missing says so and the rest run; a section that fails records its one-line error and the rest run.
``python -m energyzoo.bench.gpu_check --output DIR [--sections ...] [--processes 1 4]``; on a machine without CUDA
it refuses in one line (``--device cpu`` runs the in-process sections on the CPU, to check this machinery).
"""

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..modeling.fem_free_energy import installed
from ..training.recipe_files import ACCELERATE_CONFIGS
from .families import DECODINGS, format_family_table, run_family_checks
from .kernels import format_doctor_table, relative_error, run_doctor
from .speed import device_name

SECTIONS = ("families", "kernels", "training", "sharded", "compiled", "bench")
RECIPE = "fem-lm-tiny"
# engine (its accelerate config: energyzoo/recipes/accelerate/<engine>.yaml) -> the package it needs
ENGINE_PACKAGES = {"fsdp": None, "deepspeed-zero3": "deepspeed"}
LANGUAGE_MODELS = ("fem-lm-tiny", "fem-gla-tiny", "fem-ssm-tiny", "fem-aft-tiny", "tel-gpt2-tiny", "eqt-llama-tiny",
                   "eer-induction")
# (bench NAME, its extra arguments): Table 7's comparison first, on flash-attention in bfloat16 (fem.txt §6)
BENCHES = (("fem-lm-table7", ("--batch-size", "8", "--seq-len", "1024", "--attn-implementation", "flash_attention_2",
                              "--dtype", "bfloat16")),
           ("tel-gpt2", ()), ("tel-vit", ()), ("tel-resnet", ()), ("hyperset", ()), ("eqt-llama", ()),
           ("eer-looped", ()))
RESUME_TOLERANCE = 1e-2  # relative: bf16 steps on a GPU need not repeat bit for bit (atomics in backward)


def _command(*arguments: str, timeout: float) -> dict:
    """Run an `energyzoo` command in a process of its own: its exit code, seconds and the last lines it printed."""
    started = time.perf_counter()
    try:
        done = subprocess.run(arguments, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        code, output = "timeout", str(expired.stdout or "")
    return {"command": " ".join(arguments), "exit": code, "seconds": round(time.perf_counter() - started, 1),
            "tail": output.strip().splitlines()[-5:]}


def _energyzoo(*arguments: str, timeout: float = 600) -> dict:
    return _command(sys.executable, "-m", "energyzoo.cli", *arguments, timeout=timeout)


def families_section(device: str, output: Path) -> dict:
    checks = run_family_checks(device, decodings=tuple(d for d in DECODINGS if d != "static compiled"))
    return {"rows": [asdict(check) for check in checks], "table": format_family_table(checks, device),
            "ok": all(check.status == "pass" for check in checks)}


def kernels_section(device: str, output: Path) -> dict:
    checks = run_doctor(device, ("float32", "bfloat16"))
    return {"rows": [asdict(check) for check in checks], "table": format_doctor_table(checks, device),
            "ok": all(check.status != "FAIL" for check in checks)}


def training_section(device: str, output: Path) -> dict:
    run = output / "training"
    steps = [_energyzoo("train", RECIPE, "training.steps=20", "training.eval_every=10", f"output_dir={run}")]
    if steps[0]["exit"] == 0:
        steps.append(_energyzoo("eval", str(run / "model"), "--device", device, "--limit", "20"))
    return {"steps": steps, "table": _steps_table(steps), "ok": all(step["exit"] == 0 for step in steps)}


def sharded_runs(engine: str, processes: int, output: Path) -> dict:
    """One engine on ``processes`` GPUs: uninterrupted, and stopped after step 6 then resumed; the largest relative
    difference of a resumed weight from the uninterrupted one."""
    arguments = ["training.steps=12", f"training.batch_size={8 * processes}", "training.gradient_accumulation=2",
                 "training.save_every=6", "training.eval_every=6", "training.mixed_precision=bf16"]

    def launch(run: Path, *extra: str) -> dict:
        return _command(sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                        str(ACCELERATE_CONFIGS / f"{engine}.yaml"), "--num_processes", str(processes), "-m",
                        "energyzoo.cli", "train", RECIPE, *arguments, f"output_dir={run}", *extra, timeout=600)

    whole, resumed = output / f"{engine}-{processes}" / "whole", output / f"{engine}-{processes}" / "resumed"
    steps = [launch(whole), launch(resumed, "--stop-after", "6")]
    if all(step["exit"] == 0 for step in steps):
        steps.append(launch(resumed, "--resume"))
    result = {"engine": engine, "processes": processes, "steps": steps}
    if all(step["exit"] == 0 for step in steps):
        expected, actual = (load_file(run / "model" / "model.safetensors") for run in (whole, resumed))
        result["weight_difference"] = max(relative_error(actual[name], weight) for name, weight in expected.items())
    return result


def sharded_section(device: str, output: Path, processes: tuple[int, ...] = (1,)) -> dict:
    runs, notes = [], []
    for engine, package in ENGINE_PACKAGES.items():
        if package and not installed(package):
            notes.append(f"{engine}: {package} not installed, not run")
            continue
        runs.extend(sharded_runs(engine, count, output) for count in processes)
    lines = ["| engine | GPUs | exit codes | resumed vs uninterrupted (relative) |", "|---|---|---|---|"]
    for run in runs:
        difference = run.get("weight_difference")
        lines.append(f"| {run['engine']} | {run['processes']} | {', '.join(str(s['exit']) for s in run['steps'])} | "
                     f"{'-' if difference is None else f'{difference:.2e}'} |")
    ok = all(run.get("weight_difference", 1.0) <= RESUME_TOLERANCE for run in runs)
    return {"runs": runs, "notes": notes, "table": "\n".join([*lines, *notes]), "ok": ok}


def compiled_section(device: str, output: Path) -> dict:
    checks = run_family_checks(device, ("bfloat16",), LANGUAGE_MODELS, ("static compiled",))
    return {"rows": [asdict(check) for check in checks], "table": format_family_table(checks, device),
            "ok": all(check.status == "pass" for check in checks)}


def bench_section(device: str, output: Path) -> dict:
    steps, results = [], []
    for name, extra in BENCHES:
        path = output / f"bench-{name}.json"
        steps.append(_energyzoo("bench", name, "--device", device, *extra, "--output", str(path), timeout=900))
        if path.exists():
            results.append(json.loads(path.read_text()))
    (output / "bench.json").write_text(json.dumps(results, indent=2))
    return {"steps": steps, "table": _steps_table(steps), "ok": all(step["exit"] == 0 for step in steps)}


def _steps_table(steps: list[dict]) -> str:
    lines = ["| command | exit | s | last line |", "|---|---|---|---|"]
    for step in steps:
        last = step["tail"][-1] if step["tail"] else ""
        lines.append(f"| `{step['command'].split('energyzoo.cli ')[-1]}` | {step['exit']} | {step['seconds']} | "
                     f"{last[:120]} |")
    return "\n".join(lines)


RUNNERS = {"families": families_section, "kernels": kernels_section, "training": training_section,
           "sharded": sharded_section, "compiled": compiled_section, "bench": bench_section}
IN_PROCESS = ("families", "kernels", "compiled")  # the sections `--device cpu` can run


def environment(device: str) -> dict:
    """What the report was measured on."""
    import transformers

    facts = {"device": device_name(device), "torch": torch.__version__, "transformers": transformers.__version__,
             "cuda": torch.version.cuda}
    facts["packages"] = {package: installed(package)
                         for package in ("flash_attn", "fla", "mamba_ssm", "deepspeed", "lm_eval")}
    return facts


def render_report(report: dict) -> str:
    """The report as Markdown: what it ran on, then each section's table in order, with its status."""
    facts = report["environment"]
    lines = [f"# energyzoo GPU check on {facts['device']}", "",
             f"torch {facts['torch']} (CUDA {facts['cuda']}), transformers {facts['transformers']}; packages: "
             + ", ".join(f"{name} {'yes' if present else 'no'}" for name, present in facts["packages"].items())]
    for name in SECTIONS:
        if name not in report["sections"]:
            continue
        section = report["sections"][name]
        status = section.get("error") or ("pass" if section.get("ok") else "FAIL")
        lines += ["", f"## {name}: {status} ({section['seconds']} s)", "", section.get("table", "")]
    return "\n".join(lines).rstrip() + "\n"


def run_check(output: Path, device: str = "cuda", sections: tuple[str, ...] = SECTIONS,
              processes: tuple[int, ...] = (1,)) -> dict:
    """Run ``sections`` in `SECTIONS`' order, rewriting the report after each."""
    output.mkdir(parents=True, exist_ok=True)
    report = {"environment": environment(device), "sections": {}}
    for name in (section for section in SECTIONS if section in sections):
        started = time.perf_counter()
        try:
            options = {"processes": processes} if name == "sharded" else {}
            section = RUNNERS[name](device, output, **options)
        except Exception as error:  # noqa: BLE001 - a failing section must not cost the ones after it
            section = {"error": f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"}
        section["seconds"] = round(time.perf_counter() - started, 1)
        report["sections"][name] = section
        (output / "report.json").write_text(json.dumps(report, indent=2, default=str))
        (output / "report.md").write_text(render_report(report))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m energyzoo.bench.gpu_check", description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=Path("gpu-check"))
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--processes", nargs="+", type=int, default=[1], help="GPUs per sharded run (each value)")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for the in-process sections")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"energyzoo GPU check: no CUDA device here (torch {torch.__version__}, CUDA "
              f"{torch.version.cuda or 'none'}); install a CUDA build of torch (README, 'Installing on a GPU')",
              file=sys.stderr)
        return 2
    if not args.device.startswith("cuda") and set(args.sections) - set(IN_PROCESS):
        print(f"energyzoo GPU check: --device {args.device} runs only {', '.join(IN_PROCESS)}: pass --sections "
              "from those", file=sys.stderr)
        return 2
    report = run_check(args.output, args.device, tuple(args.sections), tuple(args.processes))
    print(render_report(report))
    failed = [name for name, section in report["sections"].items() if not section.get("ok")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
