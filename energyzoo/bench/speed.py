"""`energyzoo bench NAME`: an architecture against the baseline of the same shape, as the registry's `Bench` entry
declares it (presets, workloads, targets); `profile_split` (``--profile WORKLOAD``): where a call's time goes. The
workloads and the table are `table`'s. How the numbers are taken (paired rotating repeats of
`torch.utils.benchmark.Timer.blocked_autorange`, the IQR rule of `BenchRow`, pinned threads, the peak-memory probe,
``--compile``, length sweeps) is docs/speed.md's.
"""

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.benchmark import Timer
from transformers import CompileConfig

from ..modeling.errors import UserError
from ..modeling.fem_compiled_decoding import COMPILE_AFTER_ENV
from ..presets import config_from_preset, model_from_preset, preset_card
from ..registry import ARCHITECTURES, Bench
from .table import BUSY_IQR, DECISIONS, DECODE_PADDED_BATCH, PROFILE_GROUPS, TIMED, WORKLOADS

MIN_SAMPLE_SECONDS = 0.25  # a timed sample's blocks of calls last at least this long in all
# glibc: buffers of 64 KiB and more are mapped and unmapped one by one (no dynamic threshold, no retained heap)
PROBE_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "65536"}
DECODE_PROMPT = 32  # tokens of the one prompt the decode workloads continue (batch 1: the latency case)


@dataclass
class BenchSettings:
    batch_size: int | None = None  # None: the entry's
    seq_len: int | None = None  # None: the entry's (language models)
    repeats: int = 5
    decode_tokens: int = 64
    workloads: tuple[str, ...] | None = None  # None: the entry's; else a subset of them
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    threads: int | None = 1  # CPU cores (and torch threads) the run is pinned to; None: as the process found them
    compile: bool = False
    attn_implementation: str = "sdpa"
    overrides: dict = field(default_factory=dict)  # config fields of the measured presets (FEM: prior, kernel)


@dataclass(frozen=True)
class Arm:
    """One measured model: a preset (``overrides`` applied unless it is the baseline), run with forward keywords
    ``call`` on inputs of ``seq_len`` tokens (None: the settings')."""

    label: str
    preset: str
    call: dict = field(default_factory=dict)
    baseline: bool = False
    seq_len: int | None = None


def benched_architectures() -> list[str]:
    return [name for name, entry in ARCHITECTURES.items() if entry.bench is not None]


def bench_entry(name: str) -> tuple[Bench, tuple[str, ...]]:
    """(the registry's bench entry, the presets to measure) for an architecture or one of its presets."""
    model_type = name if name in ARCHITECTURES else config_from_preset(name).model_type
    if model_type not in ARCHITECTURES:
        raise UserError(f"{name!r} is a {model_type!r} preset; energyzoo bench measures zoo architectures")
    entry = ARCHITECTURES[model_type].bench
    if entry is None:
        raise UserError(f"{model_type!r} has no bench entry in the registry; benched: "
                         f"{', '.join(sorted(benched_architectures()))}")
    return entry, entry.presets if name in ARCHITECTURES else (name,)


def card_baseline(presets: tuple[str, ...]) -> str:
    """The one baseline the presets' cards name."""
    baselines = {preset: preset_card(preset).get("baseline") for preset in presets}
    if None in baselines.values() or len(set(baselines.values())) != 1:
        raise UserError(f"the presets' cards must name one baseline (got {baselines}); pass baseline=")
    return next(iter(baselines.values()))


def default_baseline(entry: Bench, presets: tuple[str, ...]) -> str:
    """The entry's baseline for its own presets where it names one, else the one baseline the presets' cards name."""
    if entry.baseline is not None and set(presets) <= set(entry.presets):
        return entry.baseline
    return card_baseline(presets)


def bench_arms(entry: Bench, presets: tuple[str, ...], baseline: str, workload: str) -> list[Arm]:
    """The baseline, then an arm per preset; in the forward workload of a swept entry, per swept value (a length
    sweep runs the baseline at every length too)."""
    keyword, values = entry.sweep if entry.sweep is not None and workload == "forward" else (None, ())
    if keyword == "seq_len":
        labelled = [(baseline, f"{baseline} (baseline)"), *((preset, preset) for preset in presets)]
        return [Arm(f"{label} seq_len={length}", preset, baseline=preset == baseline, seq_len=length)
                for preset, label in labelled for length in values]
    arms = [Arm(f"{baseline} (baseline)", baseline, baseline=True)]
    for preset in presets:
        arms += ([Arm(f"{preset} {keyword}={value}", preset, {keyword: value}) for value in values] if keyword
                 else [Arm(preset, preset)])
    return arms


def compared_pairs(entry: Bench, arms: list[Arm]) -> list[tuple[Arm, Arm]]:
    """(arm, reference) of each row of a workload: every arm against the baseline at its length, then the entry's
    contrasts whose two presets are both measured, then in a length sweep each preset's longest length against its
    shortest."""
    baselines = {arm.seq_len: arm for arm in arms if arm.baseline}
    measured = [arm for arm in arms if not arm.baseline]
    by_preset = {arm.preset: arm for arm in measured if not arm.call and arm.seq_len is None}
    lengths = sorted({arm.seq_len for arm in measured if arm.seq_len is not None})
    by_length = {(arm.preset, arm.seq_len): arm for arm in measured}
    return ([(arm, baselines[arm.seq_len]) for arm in measured]
            + [(by_preset[own], by_preset[reference]) for own, reference in entry.contrasts
               if {own, reference} <= by_preset.keys()]
            + [(by_length[preset, lengths[-1]], by_length[preset, lengths[0]])
               for preset in dict.fromkeys(arm.preset for arm in measured) if len(lengths) > 1])


def target_call(arm: Arm, reference: Arm) -> dict | None:
    """What an entry's ``targets`` reads of a row: the arm's forward keywords and length, and for a length sweep's
    growth row the reference length; None for a contrast of two presets, which is reported without a target."""
    lengths = {"seq_len": arm.seq_len} if arm.seq_len is not None else {}
    if reference.baseline:
        return {**arm.call, **lengths}
    if reference.preset == arm.preset and reference.seq_len is not None:
        return {**lengths, "reference_seq_len": reference.seq_len}
    return None


def _build(arm: Arm, settings: BenchSettings):
    torch.manual_seed(settings.seed)
    overrides = {} if arm.baseline else dict(settings.overrides)
    limit = getattr(config_from_preset(arm.preset), "max_position_embeddings", None)  # EER: positions for any length
    if preset_card(arm.preset)["task"] == "causal-lm" and limit is not None:
        overrides["max_position_embeddings"] = max(settings.seq_len + settings.decode_tokens, limit)
    model = model_from_preset(arm.preset, **overrides)
    prior = getattr(model.config, "prior_spec", None)  # FEM: a recurrent prior runs its own read, not attention
    if settings.attn_implementation != "sdpa" and (prior is None or prior.attention_function):
        model.set_attn_implementation(settings.attn_implementation)
    model = model.to(device=settings.device, dtype=getattr(torch, settings.dtype))
    if settings.compile:  # the forward, so that generate() and train steps run the compiled model too
        # Every model's forward is transformers' `can_return_tuple` wrapper, one code object: their graphs (eval,
        # train, prefill, decode, each per model) share dynamo's per-code cache, whose default of 8 entries would
        # send the rest back to eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        model.forward = torch.compile(model.forward)
    return model


def _inputs(model, settings: BenchSettings) -> dict[str, torch.Tensor]:
    """A seeded batch of the model's task, with labels: token ids for language models, images for classifiers."""
    generator = torch.Generator().manual_seed(settings.seed)
    config = model.config
    if hasattr(config, "num_channels"):
        side = getattr(config, "image_size", 224)
        pixels = torch.randn(settings.batch_size, config.num_channels, side, side, generator=generator)
        labels = torch.randint(0, config.num_labels, (settings.batch_size,), generator=generator)
        return {"pixel_values": pixels.to(settings.device, getattr(torch, settings.dtype)),
                "labels": labels.to(settings.device)}
    ids = torch.randint(0, config.vocab_size, (settings.batch_size, settings.seq_len), generator=generator)
    return {"input_ids": ids.to(settings.device), "labels": ids.to(settings.device)}


def device_name(device: str) -> str:
    """``device`` as a table names it: a GPU by its model (the rows of different GPUs differ), else as given."""
    return f"{torch.cuda.get_device_name(device)} ({device})" if device.startswith("cuda") else device


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _clock(device: str) -> Callable[[], float]:
    """The clock a sample is read on: perf_counter, after the device's queued work where it has a queue."""
    def clock() -> float:
        _synchronize(device)
        return time.perf_counter()

    return clock


@contextmanager
def pinned_threads(threads: int | None) -> Iterator[None]:
    """Run on ``threads`` cores (the last ones this process may use, away from core 0, where the system's interrupts
    mostly land), with as many torch threads, every thread of the process pinned; restored afterwards. None leaves
    the process as it is."""
    if threads is None:
        yield
        return
    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= threads <= len(allowed):
        raise UserError(f"--threads {threads}: this process may use {len(allowed)} cores (1 to {len(allowed)})")
    torch_threads = torch.get_num_threads()
    _set_affinity(allowed[-threads:])
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(torch_threads)
        _set_affinity(allowed)


def pinned_description(threads: int | None) -> str:
    """How a bench title says the run was pinned."""
    return "" if threads is None else f", {threads} pinned thread{'s' * (threads > 1)}"


def _set_affinity(cores: list[int]) -> None:
    for thread in os.listdir("/proc/self/task"):  # sched_setaffinity(0) would pin the calling thread only
        try:
            os.sched_setaffinity(int(thread), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile, or a foreign one
            pass


def _forward_fn(model, inputs: dict, call: dict):
    features = {key: value for key, value in inputs.items() if key != "labels"}

    def forward():
        model.eval()
        with torch.no_grad():
            model(**features, **call, **({"use_cache": False} if "input_ids" in features else {}))

    return forward


def _train_step_fn(model, inputs: dict, call: dict):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train_step():
        model.train()
        model(**inputs, **call, **({"use_cache": False} if "input_ids" in inputs else {})).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train_step


def _decode_fn(model, inputs: dict, call: dict, tokens: int, static: bool = False, sequences: int = 1):
    """Greedy decoding of ``tokens`` tokens after a `DECODE_PROMPT`-token prompt; with ``sequences`` > 1 a batch of
    that many, left-padded to one length (sequence i has 2 i pad tokens, ordinary ids under the mask)."""
    prompt = inputs["input_ids"][:1, :DECODE_PROMPT]
    if sequences > 1:
        generator = torch.Generator().manual_seed(0)
        prompt = torch.randint(model.config.vocab_size, (sequences, DECODE_PROMPT), generator=generator)
        prompt = prompt.to(inputs["input_ids"].device)
    mask = torch.ones_like(prompt)
    for row in range(sequences):
        mask[row, :2 * row] = 0
    if static:
        compile_config = CompileConfig(fullgraph=True, dynamic=False)
        compile_config._compile_all_devices = True  # transformers' own switch for compiling on CPU (its tests use it)
        call = {**call, "cache_implementation": "static", "compile_config": compile_config}

    def decode():
        model.eval()
        model.generate(prompt, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                       use_cache=True, pad_token_id=0, **call)

    return decode


# The function each timed workload (`table.TIMED`) times: ``build(model, inputs, call, settings)`` -> a call.
BUILDERS = {
    "forward": lambda model, inputs, call, settings: _forward_fn(model, inputs, call),
    "train_step": lambda model, inputs, call, settings: _train_step_fn(model, inputs, call),
    "decode": lambda model, inputs, call, settings: _decode_fn(model, inputs, call, settings.decode_tokens),
    "decode_static": lambda model, inputs, call, settings: _decode_fn(model, inputs, call, settings.decode_tokens,
                                                                      static=True),
    "decode_padded": lambda model, inputs, call, settings: _decode_fn(model, inputs, call, settings.decode_tokens,
                                                                      sequences=DECODE_PADDED_BATCH),
}


def _status_bytes(field_name: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def _reset_peak_resident() -> None:
    """Reset the kernel's resident high-water mark (VmHWM) so import-time peaks do not count."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def measure_in_own_process(workload: str, arm: Arm, settings: BenchSettings) -> float:
    """A workload measured apart from the timed ones: peak memory in MiB, or a fresh process's first generate's
    seconds."""
    if workload == "peak_memory":
        return measure_peak_memory(arm, settings) / 2**20
    return _fresh_process(workload, arm, settings)


def _fresh_process(workload: str, arm: Arm, settings: BenchSettings) -> float:
    """What a fresh Python process measures of ``arm`` (`_probe`)."""
    probe = json.dumps({"workload": workload, "arm": asdict(arm), "settings": asdict(settings)})
    result = subprocess.run([sys.executable, "-m", "energyzoo.bench.speed", probe], capture_output=True, text=True,
                            check=True, env={**os.environ, **PROBE_ENVIRONMENT})
    return float(result.stdout.strip().splitlines()[-1])


def measure_peak_memory(arm: Arm, settings: BenchSettings) -> int:
    """Peak bytes a train step of ``arm`` needs (parameters, gradients, optimiser state, activations)."""
    if settings.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        model = _build(arm, settings)
        step = _train_step_fn(model, _inputs(model, settings), arm.call)
        step()
        step()
        peak = torch.cuda.max_memory_allocated() - before
        del model, step
        return peak
    return round(_fresh_process("peak_memory", arm, settings))


def _probe(payload: str) -> None:
    """Print what a fresh process measures of one arm: the resident peak of two train steps (bytes), or the seconds
    of its first `generate` of ``decode_tokens`` tokens after the decode prompt, FEM's decoding as a user's process
    runs it (compiled where that pays: `fem_compiled_decoding`)."""
    request = json.loads(payload)
    arm, settings = Arm(**request["arm"]), BenchSettings(**request["settings"])
    if settings.threads is not None:  # the parent's pinned cores are inherited
        torch.set_num_threads(settings.threads)
    if request["workload"] == "first_generate":
        os.environ.pop(COMPILE_AFTER_ENV, None)
        model = _build(arm, settings).eval()
        prompt = _inputs(model, settings)["input_ids"][:1, :DECODE_PROMPT]
        clock = _clock(settings.device)
        start = clock()
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=settings.decode_tokens, min_new_tokens=settings.decode_tokens,
                           do_sample=False)
        print(clock() - start)
        return
    with torch.device("meta"):  # import every module the model needs before taking the baseline
        _train_step_fn(model_from_preset(arm.preset), {}, {})
    before = _status_bytes("VmRSS")
    _reset_peak_resident()
    model = _build(arm, settings)
    step = _train_step_fn(model, _inputs(model, settings), arm.call)
    step()
    step()
    print(_status_bytes("VmHWM") - before)


@contextmanager
def _decoding_compiled_at_once() -> Iterator[None]:
    """FEM's decoding region compiling at its first step (`fem_compiled_decoding`), so that the decode rows time the
    steady state a long session reaches (its compile in the first-call notes; `first_generate` times the default)."""
    before = os.environ.get(COMPILE_AFTER_ENV)
    os.environ[COMPILE_AFTER_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[COMPILE_AFTER_ENV]
        else:
            os.environ[COMPILE_AFTER_ENV] = before


def _first_calls(fns: dict, device: str) -> dict[str, float]:
    """Seconds of each function's first call, the warm-up the samples exclude: compiling (FEM's decoding step,
    ``--compile``, the static cache's) and the allocator's first requests."""
    clock, seconds = _clock(device), {}
    for key, fn in fns.items():
        start = clock()
        fn()
        seconds[key] = clock() - start
    return seconds


def _paired_times(fns: dict, repeats: int, device: str, min_seconds: float = MIN_SAMPLE_SECONDS
                  ) -> dict[str, list[float]]:
    """Seconds per call of each function, warmed up (`_first_calls`): ``repeats`` samples of each, back to back in
    an order that rotates every repeat so no model always runs first. A sample is `Timer.blocked_autorange`'s median
    over blocks of calls lasting ``min_seconds`` in all (a single call of a few milliseconds would be dominated by
    timer and scheduler jitter), with torch's thread count as it is."""
    timers = {key: Timer("fn()", globals={"fn": fn}, timer=_clock(device), num_threads=torch.get_num_threads())
              for key, fn in fns.items()}
    keys = list(fns)
    times = {key: [] for key in keys}
    for repeat in range(repeats):
        shift = repeat % len(keys)
        for key in keys[shift:] + keys[:shift]:
            times[key].append(timers[key].blocked_autorange(min_run_time=min_seconds).median)
    return times


DECIDING_REPEATS = 3  # fewer timed repeats give no interquartile range: their row's target stays "undecided"


def ratio_interval(ratios: list[float]) -> tuple[float, float]:
    """The interquartile range of the per-repeat ratios (one ratio: that ratio twice)."""
    if len(ratios) == 1:
        return ratios[0], ratios[0]
    low, _, high = statistics.quantiles(ratios, n=4, method="inclusive")
    return low, high


@dataclass
class BenchRow:
    """One line of the bench table: ``arm``'s ``workload`` against its baseline's. ``decision`` on the ``target``
    (None without one): one of `DECISIONS`, "met" or "missed" when the whole IQR of the per-repeat ratios is on one
    side of it, "undecided" when the IQR contains it."""

    arm: str
    workload: str
    unit: str
    value: float
    baseline: float
    ratio: float  # the median per-repeat ratio (arm / baseline; baseline / arm for tokens/s)
    iqr: tuple[float, float]  # the interquartile range of the per-repeat ratios
    target: float | None  # an upper bound on the ratio, a lower one for decode
    decision: str | None = None
    busy: bool = False

    def __post_init__(self):
        if self.target is not None:
            better = [bound >= self.target if WORKLOADS[self.workload].rate else bound <= self.target
                      for bound in self.iqr]
            self.decision = DECISIONS[0] if all(better) else DECISIONS[1] if not any(better) else DECISIONS[2]
        self.busy = (self.iqr[1] - self.iqr[0]) > BUSY_IQR * self.ratio


def timed_row(arm: str, workload: str, seconds: list[float], baseline: list[float], target: float | None,
              per_call: float = 1.0) -> BenchRow:
    """A row from paired per-repeat seconds; ``per_call`` > 1 turns seconds into a rate (tokens per call)."""
    if WORKLOADS[workload].rate:
        ratios = [base / own for own, base in zip(seconds, baseline)]
        value, reference = per_call / statistics.median(seconds), per_call / statistics.median(baseline)
    else:
        ratios = [own / base for own, base in zip(seconds, baseline)]
        value, reference = statistics.median(seconds), statistics.median(baseline)
    row = BenchRow(arm, workload, WORKLOADS[workload].unit, value, reference, statistics.median(ratios),
                   ratio_interval(ratios), target)
    if target is not None and len(ratios) < DECIDING_REPEATS:  # no spread to set against the target
        row.decision = DECISIONS[2]
    return row


def sweep_fit(entry: Bench, rows: list[BenchRow], workload: str = "forward") -> str | None:
    """The swept keyword's cost: ratio = intercept + slope x value by least squares, with the largest deviation of a
    measured ratio from the line (linear in the keyword when it is small)."""
    if entry.sweep is None:
        return None
    keyword, _ = entry.sweep
    points = [(int(row.arm.rsplit("=", 1)[1]), row.ratio) for row in rows
              if row.workload == workload and " vs " not in row.arm]
    if len(points) < 2:
        return None
    slope, intercept = statistics.linear_regression(*zip(*points))
    deviation = max(abs(ratio - (intercept + slope * value)) for value, ratio in points)
    return (f"linear fit of the {workload} ratio: {intercept:.3f} + {slope:.4f} {keyword} (largest deviation "
            f"{deviation:.3f})")


def _with_entry_shape(entry: Bench, settings: BenchSettings | None) -> BenchSettings:
    """``settings`` with the entry's batch size and sequence length where they leave them unset."""
    return replace(settings or BenchSettings(), batch_size=(settings and settings.batch_size) or entry.batch_size,
                   seq_len=(settings and settings.seq_len) or entry.seq_len)


def _top_level_operators(profiler) -> list:
    """The aten operators a call issued itself (not those an operator called): what dispatch pays for."""
    return [event for event in profiler.events() if event.name.startswith("aten::")
            and (event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::"))]


def _split(operators: list, wall_us: float) -> dict[str, float]:
    """Shares of a profiled call's wall time: each group's operators (their whole CPU time), the other operators, and
    the time between operators (Python, dispatch)."""
    times = dict.fromkeys((*PROFILE_GROUPS, "other operators"), 0.0)
    for event in operators:
        group = next((name for name, members in PROFILE_GROUPS.items() if event.name in members), "other operators")
        times[group] += event.cpu_time_total
    times["between operators"] = max(wall_us - sum(times.values()), 0.0)
    return {group: time / wall_us for group, time in times.items()}


def profile_split(name: str, workload: str, settings: BenchSettings | None = None, baseline: str | None = None,
                  row_limit: int = 12) -> dict:
    """Where a ratio's time goes, for the baseline and each measured preset at its own settings, at the entry's shape:
    the operators issued per unit (a generated token when decoding, else a call), the unprofiled seconds per unit,
    the profiled call's time split (`_split`), and torch.profiler's top operators by self time (``tables``)."""
    entry, presets = bench_entry(name)
    if workload not in entry.workloads or workload not in TIMED:
        timed = [item for item in entry.workloads if item in TIMED]
        raise UserError(f"--profile {workload}: {name} times {', '.join(timed)}")
    settings = _with_entry_shape(entry, settings)
    baseline = baseline or default_baseline(entry, presets)
    on_cuda = settings.device.startswith("cuda")
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_cuda else [])]
    per_unit = settings.decode_tokens * WORKLOADS[workload].sequences if WORKLOADS[workload].rate else 1
    models, sections = [], []
    torch.set_grad_enabled(True)
    with pinned_threads(settings.threads):
        for arm in bench_arms(replace(entry, sweep=None), presets, baseline, workload):
            model = _build(arm, settings)
            call = BUILDERS[workload](model, _inputs(model, settings), arm.call, settings)
            call()
            seconds = Timer("call()", globals={"call": call}).blocked_autorange(min_run_time=MIN_SAMPLE_SECONDS)
            start = time.perf_counter()
            with profile(activities=activities) as profiler:
                call()
                _synchronize(settings.device)
            wall_us = (time.perf_counter() - start) * 1e6
            operators = _top_level_operators(profiler)
            models.append({"model": arm.label, "operators": len(operators) / per_unit,
                           "seconds": seconds.median / per_unit, "split": _split(operators, wall_us)})
            averages = profiler.key_averages()
            total = sum(event.self_cpu_time_total for event in averages) / 1e6
            sections.append(f"== {arm.label}, {workload}: {total:.3f} s self CPU time\n" + averages.table(
                sort_by="self_device_time_total" if on_cuda else "self_cpu_time_total", row_limit=row_limit,
                max_name_column_width=48))
            del model, call
    unit = "generated token" if WORKLOADS[workload].rate else "call"
    return {"name": name, "presets": list(presets), "workload": workload, "unit": unit, "torch": torch.__version__,
            "title": f"{name}, {workload} ({_shape(settings, workload, presets[0])}; per {unit})", "models": models,
            "tables": "\n".join(sections)}


def _shape(settings: BenchSettings, workload: str, preset: str) -> str:
    where = f"{settings.dtype} on {device_name(settings.device)}"
    if WORKLOADS[workload].rate:
        batch = WORKLOADS[workload].sequences
        return (f"batch {batch}{', left-padded' * (batch > 1)}, a {DECODE_PROMPT}-token prompt + "
                f"{settings.decode_tokens} tokens, {where}")
    length = f", seq {settings.seq_len}" if preset_card(preset)["task"] == "causal-lm" else ""
    return f"batch {settings.batch_size}{length}, {where}"


def run_bench(name: str, settings: BenchSettings | None = None, baseline: str | None = None,
              sweep: tuple[int, ...] | None = None) -> dict:
    """Measure an architecture (its entry's presets) or one preset against the baseline, on ``settings.threads``
    pinned cores; a JSON-ready dict with the rows (`BenchRow`), notes and the raw seconds. ``sweep`` replaces the
    values of the entry's swept keyword or lengths; a ``settings.seq_len`` without ``sweep`` measures that one length
    instead of a length sweep."""
    with pinned_threads((settings or BenchSettings()).threads):
        return _measured(name, settings, baseline, sweep)


def _measured(name: str, settings: BenchSettings | None, baseline: str | None, sweep: tuple[int, ...] | None
              ) -> dict:
    entry, presets = bench_entry(name)
    if sweep is not None:
        if entry.sweep is None:
            raise UserError(f"{name} sweeps nothing; drop --sweep")
        entry = replace(entry, sweep=(entry.sweep[0], tuple(sweep)))
    elif entry.sweep is not None and entry.sweep[0] == "seq_len" and settings is not None and settings.seq_len:
        entry = replace(entry, sweep=None)  # a length asked for replaces the entry's lengths
    settings = _with_entry_shape(entry, settings)
    if settings.workloads is not None:  # the entry's, or others that apply to its models
        language_model = preset_card(presets[0])["task"] == "causal-lm"
        applicable = [key for key, workload in WORKLOADS.items() if language_model or not workload.language_models]
        unknown = sorted(set(settings.workloads) - set(applicable))
        if unknown:
            raise UserError(f"workloads {unknown}: {name} can measure {', '.join(applicable)}")
        entry = replace(entry, workloads=tuple(w for w in applicable if w in settings.workloads))
    for preset in presets:  # refuse a field the measured presets do not have before building anything
        config_from_preset(preset, **settings.overrides)
    torch.set_grad_enabled(True)
    baseline = baseline or default_baseline(entry, presets)
    arms = {workload: bench_arms(entry, presets, baseline, workload) for workload in entry.workloads}
    lengths = {arm.seq_len or settings.seq_len for workload_arms in arms.values() for arm in workload_arms}
    longest = replace(settings, seq_len=max(lengths))  # the models' positions cover every length measured
    models = {preset: _build(Arm(preset, preset, baseline=preset == baseline), longest)
              for preset in dict.fromkeys((baseline, *presets))}
    inputs = {length: _inputs(models[baseline], replace(settings, seq_len=length)) for length in lengths}
    times, first_calls = {}, {}
    with _decoding_compiled_at_once():
        for workload in (workload for workload in entry.workloads if workload in TIMED):
            fns = {arm.label: BUILDERS[workload](models[arm.preset], inputs[arm.seq_len or settings.seq_len],
                                                 arm.call, settings) for arm in arms[workload]}
            first_calls[workload] = _first_calls(fns, settings.device)
            times[workload] = _paired_times(fns, settings.repeats, settings.device)
    configs = {preset: model.config for preset, model in models.items()}
    del models
    rows = []
    for workload in entry.workloads:
        if workload not in TIMED:
            measured = {arm.label: measure_in_own_process(workload, arm, settings) for arm in arms[workload]}
        for arm, reference in compared_pairs(entry, arms[workload]):
            call = target_call(arm, reference)
            target = None if call is None else entry.targets(configs[arm.preset], call).get(workload)
            label = arm.label if reference.baseline else f"{arm.label} vs {reference.label}"
            if workload not in TIMED:
                ratio = measured[arm.label] / measured[reference.label]
                rows.append(BenchRow(label, workload, WORKLOADS[workload].unit, measured[arm.label],
                                     measured[reference.label], ratio, (ratio, ratio), target))
            else:
                rows.append(timed_row(label, workload, times[workload][arm.label], times[workload][reference.label],
                                      target, per_call=settings.decode_tokens * WORKLOADS[workload].sequences
                                      if WORKLOADS[workload].rate else 1.0))
    decodes = any(WORKLOADS[workload].rate for workload in entry.workloads)
    shape = (f"batch {settings.batch_size}" + (f", seq {settings.seq_len}" if "input_ids" in next(iter(inputs.values()))
                                                  else "")
             + f", {settings.dtype} on {device_name(settings.device)}" + pinned_description(settings.threads)
             + (", torch.compile" if settings.compile else "")
             + (f"; decoding: batch 1, a {DECODE_PROMPT}-token prompt + {settings.decode_tokens} tokens"
                + (f" (decode_padded: batch {DECODE_PADDED_BATCH}, left-padded)"
                   if "decode_padded" in entry.workloads else "")
                if decodes else ""))
    title = f"{', '.join(presets)} vs {baseline} ({shape}, median of {settings.repeats} paired repeats)"
    notes = [note for note in [sweep_fit(entry, rows)] if note]
    notes += [f"first call of {workload}, not timed: " + ", ".join(f"{arm} {value:.1f} s" for arm, value in
                                                                  seconds.items())
              for workload, seconds in first_calls.items() if WORKLOADS[workload].rate]  # what compiling costs once
    return {"name": name, "title": title, "settings": asdict(settings), "baseline": baseline, "presets": list(presets),
            "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": [asdict(row) for row in rows],
            "notes": notes, "raw_seconds": times}


if __name__ == "__main__":
    _probe(sys.argv[1])
