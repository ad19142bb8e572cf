"""`energyzoo bench PRESET --offload MEMORY`: a big model on a small machine, as a user loads it (docs/big-models.md).

The preset is built with random weights (seed 0) and saved in shards, in float32 and in the bench's ``--dtype``; then,
each in a fresh process, so that each peak is its own, it is loaded whole and with ``device_map="auto"``,
``max_memory={"cpu": MEMORY}`` and an offload folder on disk (the float32 checkpoint in float32 and in ``--dtype``,
the other in its own dtype: `cases`), and each loading greedily generates the same tokens after the same prompt.
Reported per loading: where the model's blocks were placed, the process's peak resident memory (what the operating
system counts, the pages of memory-mapped weight files it touched included; Linux's ``VmHWM``), the seconds loading
and generating took, the tokens, and whether they are the whole model's loaded the same way.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT_TOKENS = 8
NEW_TOKENS = 8
SHARD_SIZE = "1GB"
LOADINGS = ("whole", "offloaded")


def run_offload_bench(preset: str, max_memory: str, dtypes: tuple[str, ...], folder: str | None = None) -> dict:
    """The rows of ``preset`` loaded whole and offloaded (`LOADINGS`) for each (checkpoint dtype, loading dtype) of
    `cases`, its random weights saved under ``folder`` (default: a temporary folder, removed afterwards)."""
    with tempfile.TemporaryDirectory(dir=folder) as work:
        saved = {dtype: Path(work) / f"{preset}-{dtype}" for dtype in dtypes}
        _save_random_model(preset, saved)
        rows = []
        for checkpoint, dtype in cases(dtypes):
            whole = None
            for loading in LOADINGS:
                row = _in_fresh_process(saved[checkpoint], loading, dtype, max_memory,
                                        Path(work) / f"offload-{checkpoint}-{dtype}")
                whole = row["tokens"] if loading == "whole" else whole
                rows.append({"checkpoint": checkpoint, "dtype": dtype, "loading": loading, **row,
                             "tokens_equal_whole": row["tokens"] == whole})
    return {"preset": preset, "max_memory": max_memory, "prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS,
            "rows": rows}


def cases(dtypes: tuple[str, ...]) -> list[tuple[str, str]]:
    """(checkpoint dtype, loading dtype): the first dtype's checkpoint loaded in each dtype (``dtype=`` converting it
    on loading), and each other dtype's checkpoint, as a model published in it is, loaded in its own."""
    first, *others = dtypes
    return [(first, first), *((first, dtype) for dtype in others), *((dtype, dtype) for dtype in others)]


def format_offload_table(result: dict) -> str:
    lines = [f"{result['preset']}: {result['new_tokens']} greedy tokens after a prompt of {result['prompt_tokens']} "
             f"tokens; offloaded = device_map='auto', max_memory={{'cpu': '{result['max_memory']}'}}, the rest on disk",
             "",
             "| checkpoint | loaded in | loading | placed on | peak resident memory (GiB) | load (s) | generate (s) "
             "| tokens = whole model's |",
             "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['checkpoint']} | {row['dtype']} | {row['loading']} | {' + '.join(row['devices'])} | "
                     f"{row['peak_rss_bytes'] / 2**30:.2f} | "
                     f"{row['load_seconds']:.1f} | {row['generate_seconds']:.1f} | "
                     f"{'yes' if row['tokens_equal_whole'] else 'NO'} |")
    return "\n".join(lines)


def _save_random_model(preset: str, folders: dict[str, Path]) -> None:
    """The preset with random weights (seed 0), saved in shards in each dtype of ``folders`` (dtype -> folder)."""
    import torch

    from ..presets import model_from_preset

    torch.manual_seed(0)
    model = model_from_preset(preset)
    for dtype, folder in folders.items():
        model.to(getattr(torch, dtype)).save_pretrained(folder, max_shard_size=SHARD_SIZE)


def _in_fresh_process(folder: Path, loading: str, dtype: str, max_memory: str, offload_folder: Path) -> dict:
    request = json.dumps({"folder": str(folder), "loading": loading, "dtype": dtype, "max_memory": max_memory,
                          "offload_folder": str(offload_folder)})
    result = subprocess.run([sys.executable, "-m", "energyzoo.bench.offload", request], capture_output=True, text=True,
                            env=os.environ.copy())
    if result.returncode:
        raise RuntimeError(f"the {loading} {dtype} loading failed: {result.stderr.strip().splitlines()[-1:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _probe(payload: str) -> None:
    """Load the folder as asked, generate, and print one JSON line: tokens, seconds, peak resident memory."""
    import torch
    from transformers import AutoModelForCausalLM

    request = json.loads(payload)
    start = time.perf_counter()
    options = {"dtype": getattr(torch, request["dtype"])}
    if request["loading"] == "offloaded":
        options.update(device_map="auto", max_memory={"cpu": request["max_memory"]},
                       offload_folder=request["offload_folder"])
    model = AutoModelForCausalLM.from_pretrained(request["folder"], **options).eval()
    loaded = time.perf_counter()
    prompt = torch.randint(3, model.config.vocab_size, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tokens = model.generate(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=model.config.pad_token_id)
    done = time.perf_counter()
    devices = sorted(set(getattr(model, "hf_device_map", {"": "cpu"}).values()), key=str)
    peak = _peak_resident_bytes()
    print(json.dumps({"tokens": tokens[0, PROMPT_TOKENS:].tolist(), "load_seconds": loaded - start,
                      "generate_seconds": done - loaded, "peak_rss_bytes": peak, "devices": devices}))


def _peak_resident_bytes() -> int:
    """This process's peak resident memory: the kernel's high-water mark of its memory map (``VmHWM``), which starts
    anew at exec (``getrusage``'s ``ru_maxrss`` keeps the parent's peak across fork and exec)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) * 1024


if __name__ == "__main__":
    _probe(sys.argv[1])
