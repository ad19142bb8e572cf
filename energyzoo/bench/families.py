"""`energyzoo doctor --families`: every family and head on a device, in each dtype a user trains or serves in,
against the float64 result of the same weights on the CPU.

For each checked preset (`CHECKED`: every FEM prior, TEL in GPT-2, ViT and ResNet, Hyper-SET's three heads,
EqT-LLaMA, EER) and dtype, one seeded model runs twice: on the CPU in float64 (the reference) and on the device in the
dtype. Both compute the model's own loss on one seeded batch of its task (`task_inputs`) and its backward, in eval
mode (no dropout); the row gives the norm-relative errors (`kernels.relative_error`) of the device's logits and of its
worst parameter gradient, and fails on anything not finite or missing. A causal LM also decodes greedily after a
prompt with the dynamic cache, the static cache, and the static cache compiled (transformers' `CompileConfig`, whose
default mode captures CUDA graphs). Each decoding's scores are compared with the reference's logits of the very
sequence the device generated, teacher-forced without a cache: a near-tie that rounding flips is no failure, a wrong
cache is.

Tolerances are the relative errors a correct model shows, with margin: float32 on CUDA may run its convolutions and
the kernels' products in TF32 (10 mantissa bits); float16 rounds to 11 bits and bfloat16 to 8 (`TOLERANCE`, for the
outputs). A gradient carries the rounding of the forward and the backward, and some cancel: BatchNorm's in bfloat16,
Hyper-SET's step-size head summed over every iteration, EqT's refined logits (its energy's gradient taken inside the
forward), FEM-GLA's decay gates compounded over the sequence; so gradients get more (`GRADIENT_TOLERANCE`, argued
there from each dtype's roundoff). On the CPU (`--device cpu`) the float32 rows
measure 1e-7 to 1e-5, except Hyper-SET Sudoku's step-size head (7e-3), and the bfloat16 ones 3e-3 to 9e-2 (outputs)
and 6e-3 to 0.21 (gradients, EqT's the largest). A wrong layout, sign or cache is off by order 1.
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import CompileConfig

from ..presets import config_from_preset, model_from_preset, preset_card
from .kernels import relative_error
from .task_inputs import task_inputs

CHECKED = ("fem-lm-tiny", "fem-gla-tiny", "fem-ssm-tiny", "fem-aft-tiny", "tel-gpt2-tiny", "tel-vit-tiny",
           "tel-resnet-tiny", "hyperset-digits-tiny", "hyperset-mim-tiny", "hyperset-sudoku-tiny", "eqt-llama-tiny",
           "eer-induction")
TOLERANCE = {"float32": 5e-3, "float16": 2e-2, "bfloat16": 1e-1}  # outputs: logits, loss, decoding
# float16's unit roundoff is 2^-11 (4.9e-4). A parameter's gradient sums products over the sequence and both passes;
# FEM-GLA's compounds its decay gates over the sequence too and measures 8.6e-2 (176 roundoffs) on the CPU, the same
# at loss scales 2^10 to 2^16, so rounding, not underflow. 2^8 roundoffs (0.125) leave it a 1.45x margin where a wrong
# layout, sign or cache is off by order 1 (2,000 roundoffs); bfloat16's 0.4 is about 2^7 of its roundoffs (2^-8).
GRADIENT_TOLERANCE = {"float32": 4 * TOLERANCE["float32"], "float16": 2.0**8 * 2.0**-11, "bfloat16": 0.4}
GRADIENT_FLOOR = 1e-3
# float16 trains with a scaled loss (torch.amp.GradScaler), or its small gradients fall below its smallest normal
# number (6e-5): unscaled, FEM-GLA's key gradients lose 9 % to underflow. A fixed 2^10, as GradScaler would settle.
LOSS_SCALE = {"float16": 2.0**10}
DECODINGS = ("dynamic", "static", "static compiled")
PROMPT, DECODED = 8, 8


@dataclass
class FamilyCheck:
    preset: str
    dtype: str
    status: str  # "pass", "FAIL: what failed", or why it did not run
    logits_error: float | None = None
    gradient_error: float | None = None
    decoding_errors: dict[str, float] = field(default_factory=dict)  # decoding (`DECODINGS`) -> error
    seconds: float = 0.0


def _loss_logits_gradients(model, inputs: dict, loss_scale: float = 1.0
                           ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The model's loss, logits and parameter gradients, in float64 on the CPU; backward from the loss times
    ``loss_scale``, the gradients divided by it again."""
    model.zero_grad(set_to_none=True)
    outputs = model(**inputs)
    (outputs.loss * loss_scale).backward()
    gradients = {name: parameter.grad.detach().to("cpu", torch.float64) / loss_scale
                 for name, parameter in model.named_parameters() if parameter.grad is not None}
    return outputs.loss.detach().to("cpu", torch.float64), outputs.logits.detach().to("cpu", torch.float64), gradients


def gradient_error(gradients: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """The worst parameter's ||g - g_ref|| / ||g_ref||, each ||g_ref|| taken at least `GRADIENT_FLOOR` of the whole
    gradient's norm: a gradient that is zero in exact arithmetic (a key bias under softmax) is rounding alone in any
    other dtype. A parameter without a gradient where the reference has one is an infinite error."""
    norms = {name: torch.linalg.vector_norm(gradient) for name, gradient in expected.items()}
    floor = GRADIENT_FLOOR * torch.linalg.vector_norm(torch.stack(list(norms.values())))
    return max((float(torch.linalg.vector_norm(gradients[name] - gradient) / max(norms[name], floor, 1e-30))
                if name in gradients else math.inf) for name, gradient in expected.items())


def _on(inputs: dict, device: str, dtype: torch.dtype) -> dict:
    return {name: value.to(device=device, dtype=dtype) if value.is_floating_point() else value.to(device)
            for name, value in inputs.items()}


def _decoding_options(decoding: str, device: str) -> dict:
    if decoding == "dynamic":
        return {}
    if decoding == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    compile_config = CompileConfig()  # fullgraph, mode "reduce-overhead": CUDA graphs
    compile_config._compile_all_devices = torch.device(device).type != "cuda"  # transformers' own switch elsewhere
    return {"cache_implementation": "static", "compile_config": compile_config}


def decoding_error(model, reference, prompt: torch.Tensor, decoding: str) -> float:
    """Greedy decoding of `DECODED` tokens after ``prompt`` on the device: its scores against the reference's logits
    of the same sequence, teacher-forced without a cache."""
    device = next(model.parameters()).device
    generated = model.generate(prompt.to(device), attention_mask=torch.ones_like(prompt, device=device),
                               max_new_tokens=DECODED, min_new_tokens=DECODED, do_sample=False, pad_token_id=0,
                               output_logits=True, return_dict_in_generate=True,
                               **_decoding_options(decoding, device.type))
    with torch.no_grad():
        expected = reference(generated.sequences.cpu(), use_cache=False).logits[:, prompt.shape[1] - 1:-1]
    return relative_error(torch.stack(generated.logits, dim=1).cpu().double(), expected)


def check_family(preset: str, dtype: str, device: str, decodings: tuple[str, ...] = DECODINGS,
                 seed: int = 0) -> FamilyCheck:
    """One row: ``preset`` on ``device`` in ``dtype`` against float64 on the CPU (module docstring)."""
    started = time.perf_counter()
    task = preset_card(preset)["task"]
    torch.manual_seed(seed)
    reference = model_from_preset(preset).double().eval()
    model = model_from_preset(preset).eval()
    model.load_state_dict(reference.state_dict())
    model = model.to(device=device, dtype=getattr(torch, dtype))
    config = config_from_preset(preset)
    # Hyper-SET's grids take exactly their cells; a language model any length
    length = 16 if task == "causal-lm" else getattr(config, "max_position_embeddings", 16)
    inputs = task_inputs(task, config, torch.Generator().manual_seed(seed), batch=2, length=length)
    call = {"use_cache": False} if task == "causal-lm" else {}
    expected_loss, expected_logits, expected_gradients = _loss_logits_gradients(
        reference, {**_on(inputs, "cpu", torch.float64), **call})
    loss, logits, gradients = _loss_logits_gradients(model, {**_on(inputs, device, getattr(torch, dtype)), **call},
                                                     LOSS_SCALE.get(dtype, 1.0))
    check = FamilyCheck(preset, dtype, "pass", relative_error(logits, expected_logits),
                        gradient_error(gradients, expected_gradients))
    if task == "causal-lm":
        prompt = inputs["input_ids"][:1, :PROMPT]
        check.decoding_errors = {decoding: decoding_error(model, reference, prompt, decoding) for decoding in decodings}
    outputs = (("loss", relative_error(loss, expected_loss)), ("logits", check.logits_error),
               *check.decoding_errors.items())
    failures = [name for name, error, tolerance in ((*output, TOLERANCE[dtype]) for output in outputs)
                if not (math.isfinite(error) and error <= tolerance)]
    if not (math.isfinite(check.gradient_error) and check.gradient_error <= GRADIENT_TOLERANCE[dtype]):
        failures.append("gradients")
    if failures:
        check.status = "FAIL: " + ", ".join(failures)
    check.seconds = time.perf_counter() - started
    return check


def run_family_checks(device: str = "cuda", dtypes: tuple[str, ...] = tuple(TOLERANCE),
                      presets: tuple[str, ...] | None = None, decodings: tuple[str, ...] | None = None,
                      on_row: Callable[[FamilyCheck], None] | None = None) -> list[FamilyCheck]:
    """Every (preset, dtype) row (None: every `CHECKED` preset, every one of `DECODINGS`); an error in one is its row's
    failure, in one line, and the rest still run. ``on_row`` is told each row as it is done."""
    checks = []
    decodings = DECODINGS if decodings is None else decodings
    presets = CHECKED if presets is None else presets
    # every row's compiled decoding recompiles transformers' one forward wrapper: dynamo's default limit (8) would send
    # the later rows back to eager with a warning each
    with torch._dynamo.config.patch(recompile_limit=max(torch._dynamo.config.recompile_limit,
                                                        2 * len(presets) * len(dtypes))):
        for preset in presets:
            for dtype in dtypes:
                checks.append(_checked_row(preset, dtype, device, decodings))
                if on_row is not None:
                    on_row(checks[-1])
    return checks


def _checked_row(preset: str, dtype: str, device: str, decodings: tuple[str, ...]) -> FamilyCheck:
    """One row of `run_family_checks`."""
    try:
        return check_family(preset, dtype, device, decodings)
    except Exception as error:  # noqa: BLE001 - a cut or failing row must not hide the others
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return FamilyCheck(preset, dtype, f"FAIL: {type(error).__name__}: {message}"[:300])


def format_family_table(checks: list[FamilyCheck], device: str) -> str:
    lines = [f"Every family on {device} against float64 on the CPU (relative errors; tolerance "
             + ", ".join(f"{dtype} {tolerance:g}" for dtype, tolerance in TOLERANCE.items())
             + "; gradients " + ", ".join(f"{dtype} {tolerance:g}" for dtype, tolerance in GRADIENT_TOLERANCE.items())
             + ")",
             "| preset | dtype | logits | gradients | " + " | ".join(DECODINGS) + " | s | status |",
             "|---|---|---|---|" + "---|" * len(DECODINGS) + "---|---|"]

    def shown(value):
        return "-" if value is None else f"{value:.2e}"

    for check in checks:
        decoded = " | ".join(shown(check.decoding_errors.get(decoding)) for decoding in DECODINGS)
        lines.append(f"| {check.preset} | {check.dtype} | {shown(check.logits_error)} | {shown(check.gradient_error)} "
                     f"| {decoded} | {check.seconds:.1f} | {check.status} |")
    return "\n".join(lines)
