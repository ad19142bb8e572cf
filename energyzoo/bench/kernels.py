"""`energyzoo doctor`: the GPU kernel libraries FEM's priors dispatch to, each checked against the PyTorch path it
replaces, on the user's own GPU.

For each (prior, kernel) - softmax through flash-attn, GLA through fla, SSM through mamba-ssm - and each dtype, a
small FEM-LM (two layers of ``fem-lm-tiny``, left-padded batch) runs twice with the same weights: once on the
PyTorch path (``kernel="torch"``, or SDPA for the softmax prior) and once on the kernel. Reported as norm-relative
errors against the PyTorch path: the logits', the worst parameter gradient's, and that of cached decoding (a prefill
then one token per call, the kernels' recurrent state carried by the cache) against the full forward. The kernels'
matrix products may run in TF32 for float32 inputs, hence the float32 tolerance. flash-attn has no float32 kernel
(FEM's softmax prior needs bfloat16 on it), so that pair is not run.
"""

import math
from dataclasses import dataclass

import torch

from ..modeling.configuration_fem import PRIORS
from ..modeling.fem_free_energy import installed
from ..modeling.transformers_compat import cache_of
from ..presets import model_from_preset

# (prior, kernel, the package the kernel needs) of each prior with a GPU kernel (`PriorSpec.gpu_kernel`)
KERNELS = tuple((name, *spec.gpu_kernel) for name, spec in PRIORS.items() if spec.gpu_kernel is not None)
# bfloat16 rounding alone moves small cancelling gradients (beta_max's) by a few percent; a wrong calling convention
# (layout, gate sign, state) moves everything by order 1
TOLERANCE = {"float32": 5e-3, "bfloat16": 1e-1}
DECODED_TOKENS = 3


@dataclass
class KernelCheck:
    prior: str
    kernel: str
    dtype: str
    status: str  # "pass", "FAIL", or why it did not run
    logits_error: float | None = None
    gradient_error: float | None = None
    decoding_error: float | None = None


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (Frobenius): robust to the few elements bfloat16 rounding moves most."""
    expected = expected.float()
    difference = torch.linalg.vector_norm(actual.float() - expected)
    return float(difference / torch.linalg.vector_norm(expected).clamp_min(1e-30))


def _use(model, prior: str, kernel: str) -> None:
    """Switch ``model`` (same weights) between the PyTorch path ("torch") and ``kernel``."""
    if PRIORS[prior].attention_function:  # the attention function is read from the config at every call
        model.config._attn_implementation = "sdpa" if kernel == "torch" else kernel
    else:
        model.config.kernel = kernel


def _run(model, ids, mask):
    """Logits and parameter gradients of a training step, and the logits of cached decoding of the last tokens."""
    model.zero_grad()
    outputs = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
    outputs.loss.backward()
    gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    with torch.no_grad():
        prefix = ids.shape[1] - DECODED_TOKENS
        step = model(input_ids=ids[:, :prefix], attention_mask=mask[:, :prefix], use_cache=True)
        cache, decoded = cache_of(step), []
        for position in range(prefix, ids.shape[1]):
            step = model(input_ids=ids[:, position:position + 1], attention_mask=mask[:, :position + 1],
                         cache=cache, use_cache=True)
            decoded.append(step.logits)
    return outputs.logits.detach(), gradients, torch.cat(decoded, dim=1)


def check_kernel(prior: str, kernel: str, dtype: str, device: str, seed: int = 0) -> KernelCheck:
    """One row of the doctor's table; the kernel is assumed runnable (see `run_doctor`)."""
    torch.manual_seed(seed)
    model = model_from_preset("fem-lm-tiny", prior=prior, num_hidden_layers=2)
    model = model.to(device=device, dtype=getattr(torch, dtype)).eval()  # eval: a cache for the decoding check
    ids = torch.randint(4, model.config.vocab_size, (2, 24), device=device)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # left padding, ordinary tokens under it
    runs = {}
    for name in ("torch", kernel):
        _use(model, prior, name)
        runs[name] = _run(model, ids, mask)
    (logits, gradients, _), (kernel_logits, kernel_gradients, kernel_decoded) = runs["torch"], runs[kernel]
    real = mask.bool()
    errors = dict(
        logits_error=relative_error(kernel_logits[real], logits[real]),
        gradient_error=max(relative_error(kernel_gradients[name], gradient) for name, gradient in gradients.items()),
        decoding_error=relative_error(kernel_decoded, logits[:, -DECODED_TOKENS:]),
    )
    passed = all(math.isfinite(error) and error <= TOLERANCE[dtype] for error in errors.values())
    return KernelCheck(prior, kernel, dtype, "pass" if passed else "FAIL", **errors)


def why_not_runnable(package: str, kernel: str, dtype: str, device: str) -> str | None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device"
    if not installed(package):
        return f"{package} not installed (pip install 'energyzoo[cuda]')"
    if kernel == "flash_attention_2" and dtype != "bfloat16":
        return "flash-attn has no float32 kernel"
    return None


def run_doctor(device: str = "cuda", dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> list[KernelCheck]:
    checks = []
    for prior, kernel, package in KERNELS:
        for dtype in dtypes:
            reason = why_not_runnable(package, kernel, dtype, device)
            checks.append(KernelCheck(prior, kernel, dtype, f"not run: {reason}") if reason
                          else check_kernel(prior, kernel, dtype, device))
    return checks


def format_doctor_table(checks: list[KernelCheck], device: str) -> str:
    lines = [f"FEM kernels against the PyTorch path on {device} (relative errors; tolerance "
             + ", ".join(f"{dtype} {tolerance:g}" for dtype, tolerance in TOLERANCE.items()) + ")",
             "| prior   | kernel            | dtype    | logits   | gradients | decoding | status",
             "|---------|-------------------|----------|----------|-----------|----------|-------"]
    for check in checks:
        errors = [f"{value:.2e}" if value is not None else "-" for value in
                  (check.logits_error, check.gradient_error, check.decoding_error)]
        lines.append(f"| {check.prior:<7} | {check.kernel:<17} | {check.dtype:<8} | {errors[0]:<8} | {errors[1]:<9} "
                     f"| {errors[2]:<8} | {check.status}")
    return "\n".join(lines)
