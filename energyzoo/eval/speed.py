"""`energyzoo bench`: FEM-LM against the Llama baseline of the same shape, TEL GPT-2 against GPT-2 (DESIGN.md
performance targets).

Rows: forward time (full sequence, no cache), train-step time (forward + backward + AdamW step), peak
memory of a train step, and cached greedy decoding throughput. FEM and Llama run in pairs, back to back
in one process and in alternating order, ``repeats`` times; the times are medians, and the ratio is the
median of the per-pair ratios FEM / Llama (for decoding, tokens/s FEM / Llama), which cancels the slow
drifts of a shared machine. On CPU, peak memory is the peak resident set of a fresh process that
builds the model and runs train steps, minus that process's footprint before the model exists; on CUDA it
is the allocator's peak. (Linux: the resident high-water mark is reset after imports.)

FEM options: ``prior`` replaces the preset's prior, ``kernel`` is `FEMConfig.kernel` ("auto" runs fla / mamba-ssm
on CUDA when installed; "torch" the PyTorch reads), and ``attn_implementation`` ("sdpa" or "flash_attention_2",
which needs bfloat16) is that of the baseline and of FEM's softmax prior (the recurrent priors run their own read).
fem.txt Table 7 (GPT-2 size, seq 1024, batch 8, L40S) is ``preset="fem-lm-table7"`` against its "llama-table7":
FEM-SM +L,T,G at 1.07x the forward and 1.10x the train step of flash softmax attention.

``compile=True`` (`energyzoo bench --compile`) runs both models' forward through ``torch.compile`` (the default
inductor backend, also inside the memory probe) and warms every workload up before timing, so compilation
and recompilation for new shapes are not timed.
"""

import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch
from transformers import AutoModel

from ..presets import config_from_preset, model_from_preset, preset_card
from ..registry import ARCHITECTURES

TARGETS = {"forward": 1.10, "train_step": 1.20, "peak_memory": 1.20, "decode_tokens_per_s": 0.85}
LINEAR_SCALING_TARGET = 4.5  # time(T=4096) / time(T=1024) for O(T) priors (DESIGN.md)
TEL_HEAD_FORWARD_TARGET = 1.05  # TEL-head GPT-2 / GPT-2 forward time (DESIGN.md)
EQT_FORWARD_TARGET = 2.0  # EqT-LLaMA at K = 8 / its base Llama, forward (DESIGN.md)


def card_baseline(preset: str) -> str:
    baseline = preset_card(preset).get("baseline")
    if baseline is None:
        raise ValueError(f"preset {preset!r} names no baseline in its card; pass baseline=")
    return baseline


@dataclass
class BenchSettings:
    preset: str = ARCHITECTURES["fem"].bench_presets[0]
    baseline: str | None = None  # None: the preset card's baseline
    batch_size: int = 4
    seq_len: int = 1024
    repeats: int = 5
    decode_tokens: int = 64
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    compile: bool = False
    prior: str | None = None  # None: the preset's
    kernel: str = "auto"
    attn_implementation: str = "sdpa"

    def resolved_baseline(self) -> str:
        return self.baseline or card_baseline(self.preset)


def _build(preset: str, settings: BenchSettings):
    torch.manual_seed(settings.seed)
    overrides = {"max_position_embeddings": max(4096, settings.seq_len + settings.decode_tokens)}
    if config_from_preset(preset).model_type == "fem":
        overrides.update(kernel=settings.kernel, **({} if settings.prior is None else {"prior": settings.prior}))
    model = model_from_preset(preset, **overrides)
    if getattr(model.config, "prior", "softmax") == "softmax":
        model.set_attn_implementation(settings.attn_implementation)
    model = model.to(device=settings.device, dtype=getattr(torch, settings.dtype))
    if settings.compile:  # the forward, so that generate() and train steps run the compiled model too
        # Both models' forwards are transformers' `can_return_tuple` wrapper, one code object: their graphs
        # (eval, train, prefill, decode, each per model) share dynamo's per-code cache, whose default of 8
        # entries would send the rest back to eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        model.forward = torch.compile(model.forward)
    return model


def _batch(model, settings: BenchSettings) -> torch.Tensor:
    generator = torch.Generator().manual_seed(settings.seed)
    ids = torch.randint(0, model.config.vocab_size, (settings.batch_size, settings.seq_len), generator=generator)
    return ids.to(settings.device)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str) -> float:
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


def _forward_fn(model, ids):
    def forward():
        model.eval()
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    return forward


def _train_step_fn(model, ids):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step():
        model.train()
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train_step


def _decode_fn(model, ids, tokens: int):
    prompt = ids[:1, :32]

    def decode():
        model.eval()
        model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, use_cache=True,
                       pad_token_id=0)

    return decode


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_resident() -> None:
    """Reset the kernel's resident high-water mark (VmHWM) so import-time peaks do not count."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def measure_peak_memory(preset: str, settings: BenchSettings) -> int:
    """Peak bytes a train step of ``preset`` needs (parameters, gradients, optimiser state, activations)."""
    if settings.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        model = _build(preset, settings)
        step = _train_step_fn(model, _batch(model, settings))
        step()
        step()
        peak = torch.cuda.max_memory_allocated() - before
        del model, step
        return peak
    probe = json.dumps({"preset": preset, "settings": asdict(settings)})
    result = subprocess.run([sys.executable, "-m", "energyzoo.eval.speed", probe], capture_output=True, text=True,
                            check=True)
    return int(result.stdout.strip().splitlines()[-1])


def _memory_probe(payload: str) -> None:
    request = json.loads(payload)
    settings = BenchSettings(**request["settings"])
    with torch.device("meta"):  # import every module the model needs before taking the baseline
        _train_step_fn(model_from_preset(request["preset"]), None)
    before = _status_bytes("VmRSS")
    _reset_peak_resident()
    model = _build(request["preset"], settings)
    step = _train_step_fn(model, _batch(model, settings))
    step()
    step()
    print(_status_bytes("VmHWM") - before)


def _paired_times(fns: dict, repeats: int, device: str) -> dict[str, list[float]]:
    """Seconds per call of each function, run back to back `repeats` times after a warm-up, in an order that
    rotates every repeat so no model always runs first."""
    for fn in fns.values():
        fn()
    keys = list(fns)
    times = {key: [] for key in keys}
    for repeat in range(repeats):
        shift = repeat % len(keys)
        for key in keys[shift:] + keys[:shift]:
            times[key].append(_timed(fns[key], device))
    return times


def run_fem_vs_llama(settings: BenchSettings) -> dict:
    """Measure the preset and its baseline; returns a JSON-ready dict of medians, ratios and targets."""
    torch.set_grad_enabled(True)
    names = {"fem": settings.preset, "llama": settings.resolved_baseline()}
    models = {key: _build(name, settings) for key, name in names.items()}
    ids = _batch(models["fem"], settings)
    workloads = {
        "forward": {key: _forward_fn(model, ids) for key, model in models.items()},
        "train_step": {key: _train_step_fn(model, ids) for key, model in models.items()},
        "decode": {key: _decode_fn(model, ids, settings.decode_tokens) for key, model in models.items()},
    }
    times = {workload: _paired_times(fns, settings.repeats, settings.device) for workload, fns in workloads.items()}
    del models, workloads
    memory = {key: measure_peak_memory(name, settings) for key, name in names.items()}

    def timed_row(workload: str) -> dict:
        per = times[workload]
        paired = [fem / llama for fem, llama in zip(per["fem"], per["llama"])]
        return {"unit": "s", "fem": statistics.median(per["fem"]), "llama": statistics.median(per["llama"]),
                "ratio": statistics.median(paired)}

    rows = {
        "forward": timed_row("forward"),
        "train_step": timed_row("train_step"),
        "peak_memory": {"unit": "MiB", "fem": memory["fem"] / 2**20, "llama": memory["llama"] / 2**20,
                        "ratio": memory["fem"] / memory["llama"]},
    }
    decode = timed_row("decode")
    rows["decode_tokens_per_s"] = {"unit": "tok/s", "fem": settings.decode_tokens / decode["fem"],
                                   "llama": settings.decode_tokens / decode["llama"], "ratio": 1 / decode["ratio"]}
    for name, row in rows.items():
        row["target"] = TARGETS[name]
        higher_is_better = name == "decode_tokens_per_s"
        row["meets_target"] = row["ratio"] >= row["target"] if higher_is_better else row["ratio"] <= row["target"]
    prior = settings.prior or config_from_preset(settings.preset).prior
    return {"settings": asdict(settings), "models": names, "prior": prior, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "rows": rows, "raw_seconds": times}


def format_table(result: dict) -> str:
    models = result["models"]
    settings = result["settings"]
    compiled = ", torch.compile" if settings.get("compile") else ""
    lines = [
        f"{models['fem']} vs {models['llama']}  (batch {settings['batch_size']}, seq {settings['seq_len']}, "
        f"{settings['dtype']} on {settings['device']}{compiled}, median of {settings['repeats']}; FEM prior "
        f"{result['prior']}, kernel {settings['kernel']}, attention {settings['attn_implementation']})",
        f"| {'metric':<20} | {'FEM':>10} | {'Llama':>10} | {'ratio':>6} | {'target':>7} | ok  |",
        f"|{'-' * 22}|{'-' * 12}|{'-' * 12}|{'-' * 8}|{'-' * 9}|-----|",
    ]
    for name, row in result["rows"].items():
        bound = ">=" if name == "decode_tokens_per_s" else "<="
        lines.append(
            f"| {name + ' (' + row['unit'] + ')':<20} | {row['fem']:>10.4g} | {row['llama']:>10.4g} | "
            f"{row['ratio']:>6.3f} | {bound}{row['target']:>5.2f} | {'yes' if row['meets_target'] else 'NO':<3} |"
        )
    return "\n".join(lines)


def run_tel_vs_vanilla(
    variants: tuple[str, ...] = ARCHITECTURES["tel-gpt2"].bench_presets,
    baseline: str | None = None,
    batch_size: int = 2,
    seq_len: int = 512,
    repeats: int = 9,
    device: str = "cpu",
) -> dict:
    """Forward time of TEL models against their vanilla baseline of equal size (DESIGN.md: TEL-head GPT-2 <=
    1.05x GPT-2); ratio = median over repeats of the per-repeat ratio variant / baseline. ``baseline`` None: the
    first variant's card baseline."""
    baseline = baseline or card_baseline(variants[0])
    names = {"baseline": baseline, **{variant: variant for variant in variants}}
    models, sizes = {}, {}
    for key, name in names.items():
        torch.manual_seed(0)
        models[key] = model_from_preset(name).to(device)
        sizes[key] = sum(p.numel() for p in models[key].parameters())
    ids = torch.randint(0, models["baseline"].config.vocab_size, (batch_size, seq_len), device=device)
    times = _paired_times({key: _forward_fn(model, ids) for key, model in models.items()}, repeats, device)
    rows = {}
    for key in names:
        ratio = statistics.median(t / b for t, b in zip(times[key], times["baseline"]))
        target = TEL_HEAD_FORWARD_TARGET if getattr(models[key].config, "tel_placement", None) == "head" else None
        rows[names[key]] = {"seconds": statistics.median(times[key]), "parameters": sizes[key], "ratio": ratio,
                            "target": target, "meets_target": None if target is None else ratio <= target}
    return {"baseline": baseline, "batch_size": batch_size, "seq_len": seq_len, "repeats": repeats, "device": device,
            "threads": torch.get_num_threads(), "rows": rows, "raw_seconds": times}


def format_tel_table(result: dict) -> str:
    lines = [
        f"TEL vs {result['baseline']} forward (batch {result['batch_size']}, seq {result['seq_len']}, "
        f"{result['device']}, median of {result['repeats']} paired repeats)",
        "| model | parameters | forward (s) | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for name, row in result["rows"].items():
        target = "" if row["target"] is None else f"<= {row['target']} ({'met' if row['meets_target'] else 'NOT met'})"
        lines.append(f"| {name} | {row['parameters'] / 1e6:.2f}M | {row['seconds']:.4f} | {row['ratio']:.3f} "
                     f"| {target} |")
    return "\n".join(lines)


def run_length_scaling(
    preset: str = "fem-lm-tiny",
    priors: tuple[str, ...] = ("softmax", "gla", "aft", "ssm"),
    lengths: tuple[int, int] = (1024, 4096),
    repeats: int = 5,
    batch_size: int = 2,
    device: str = "cpu",
) -> dict:
    """Forward time of the base model (no LM head, whose cost is linear in T for every prior) at two
    lengths, per prior: the ratio is ~(long/short)^2 for softmax and ~long/short for recurrent priors."""
    short, long = lengths
    rows = {}
    for prior in priors:
        torch.manual_seed(0)
        config = config_from_preset(preset, prior=prior, max_position_embeddings=max(lengths))
        model = AutoModel.from_config(config).to(device).eval()
        seconds = {}
        for length in lengths:
            ids = torch.randint(0, config.vocab_size, (batch_size, length), device=device)
            fn = _forward_fn(model, ids)
            fn()
            seconds[length] = statistics.median(_timed(fn, device) for _ in range(repeats))
        ratio = seconds[long] / seconds[short]
        target = None if prior == "softmax" else LINEAR_SCALING_TARGET
        rows[prior] = {"seconds": seconds, "ratio": ratio, "target": target,
                       "meets_target": None if target is None else ratio <= target}
    return {"preset": preset, "lengths": list(lengths), "batch_size": batch_size, "repeats": repeats, "rows": rows}


def format_scaling_table(result: dict) -> str:
    short, long = result["lengths"]
    lines = [
        f"forward time vs sequence length ({result['preset']} base model, batch {result['batch_size']}, "
        f"median of {result['repeats']})",
        f"| prior   | T={short} (s) | T={long} (s) | ratio | target  |",
        "|---------|------------|------------|-------|---------|",
    ]
    for prior, row in result["rows"].items():
        target = "~16 (O(T^2))" if row["target"] is None else f"<= {row['target']}"
        lines.append(f"| {prior:<7} | {row['seconds'][short]:>10.4f} | {row['seconds'][long]:>10.4f} | "
                     f"{row['ratio']:>5.2f} | {target} |")
    return "\n".join(lines)


def run_eqt_vs_llama(
    preset: str = ARCHITECTURES["eqt-llama"].bench_presets[0],
    steps: tuple[int, ...] = (0, 1, 2, 4, 8, 16),
    batch_size: int = 1,
    seq_len: int = 512,
    repeats: int = 5,
    device: str = "cpu",
) -> dict:
    """Inference forward time of EqT-LLaMA at each K against its base Llama (the card's baseline, whose weights it
    loads), in one paired run: per repeat, Llama and EqT at every K back to back in rotating order; the ratio at K
    is the median of the per-repeat ratios. ``linear_fit``: time(K) / Llama = intercept + slope K by least squares
    over the K's, with the largest deviation of a measured ratio from the line (linear in K when it is small)."""
    torch.manual_seed(0)
    baseline = card_baseline(preset)
    llama = model_from_preset(baseline).to(device).eval()
    eqt = model_from_preset(preset).to(device).eval()
    eqt.load_state_dict(llama.state_dict(), strict=False)
    ids = torch.randint(0, llama.config.vocab_size, (batch_size, seq_len), device=device)

    def forward(model, **options):
        def run():
            with torch.no_grad():
                model(input_ids=ids, use_cache=False, **options)
        return run

    fns = {"llama": forward(llama), **{f"K={k}": forward(eqt, refinement_steps=k) for k in steps}}
    times = _paired_times(fns, repeats, device)
    ratios = {k: statistics.median(e / b for e, b in zip(times[f"K={k}"], times["llama"])) for k in steps}
    slope, intercept = statistics.linear_regression(list(steps), [ratios[k] for k in steps])
    deviation = max(abs(ratios[k] - (intercept + slope * k)) for k in steps)
    at_eight = ratios.get(8)
    return {"preset": preset, "baseline": baseline, "batch_size": batch_size, "seq_len": seq_len, "repeats": repeats,
            "device": device, "threads": torch.get_num_threads(), "llama_seconds": statistics.median(times["llama"]),
            "seconds": {k: statistics.median(times[f"K={k}"]) for k in steps}, "ratios": ratios,
            "linear_fit": {"intercept": intercept, "slope_per_step": slope, "max_deviation": deviation},
            "target": EQT_FORWARD_TARGET, "meets_target": None if at_eight is None else at_eight <= EQT_FORWARD_TARGET,
            "raw_seconds": times}


def format_eqt_table(result: dict) -> str:
    fit = result["linear_fit"]
    lines = [
        f"{result['preset']} vs {result['baseline']} inference forward (batch {result['batch_size']}, seq "
        f"{result['seq_len']}, {result['device']}, median of {result['repeats']} paired repeats; Llama "
        f"{result['llama_seconds']:.3f} s)",
        "| K | EqT (s) | EqT / Llama |",
        "|---|---|---|",
    ]
    for k, ratio in result["ratios"].items():
        lines.append(f"| {k} | {result['seconds'][k]:.3f} | {ratio:.3f} |")
    verdict = "" if result["meets_target"] is None else (
        f"; K = 8 target <= {result['target']}: {'met' if result['meets_target'] else 'NOT met'}")
    lines.append(f"linear fit: ratio = {fit['intercept']:.3f} + {fit['slope_per_step']:.4f} K (largest deviation "
                 f"{fit['max_deviation']:.3f}){verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    _memory_probe(sys.argv[1])
