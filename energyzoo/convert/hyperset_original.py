"""The authors' Hyper-SET checkpoints (huyunzhe/hyper-set, MIT; weights on the Hub as Yunzhe/Hyper-SET) as energyzoo
models: their state dict and task options -> (a `HyperSETConfig`, the state dict of an energyzoo head).

What the state dict says is read from it (width, heads from the per-head norm, layers, intermediate width, classes,
LoRA rank and iterations, the time embedding's width, a CLS token, learned positions, which step-size network).
What it cannot say (the iteration count without LoRA, the image size, ``input_cond``, ``adaptive_mode``, the LoRA
alpha, the alternative model's attention or feed-forward, MaskGIT's ``phi_func``) comes from the authors' task
options, in their names (their Hydra config's ``model`` and ``data`` keys); an option not given takes the value of
the authors' shipped task YAML, and `convert_original` reports which it took. `load_hyperset_original` is the
entry: the checkpoint as the energyzoo head of its task. Every key of the state dict is mapped
or named as unused; any other key is refused by name. The weights are renamed, and the per-iteration LoRA factors
stacked, nothing else: a converted model computes what the authors' model computes.
"""

import math
import re
import textwrap
from pathlib import Path

import torch
from transformers.utils import logging

from ..modeling.configuration_hyperset import HyperSETConfig
from ..modeling.errors import UserError
from ..registry import ARCHITECTURES
from .hyperset_original_options import ORIGINAL_DATASETS, ORIGINAL_DEFAULTS

logger = logging.get_logger(__name__)

# adaptive_mode -> (update_mode, the fixed (alpha, gamma) of MaskGIT's fixed-step modes)
ADAPTIVE_MODES = {
    "gd_with_learnable_step_size": ("gd", None),
    "gd_momentum_with_learnable_step_size": ("momentum", None),
    "rmsprop_with_fix_step_size": ("rmsprop", (0.5, 0.1)),
    "rmsprop_momentum_with_fix_step_size": ("rmsprop_momentum", (0.5, 0.1)),
    "adam_with_fix_step_size": ("adam", (0.5, 0.1)),
}
# The alternative models' options energyzoo expresses (App. G.1 with phi = sigmoid).
ALTERNATIVE_ATTENTIONS = {"bisoftmax": "bisoftmax", "sigma": "sigmoid", "sigmoid": "linear"}
ALTERNATIVE_FEEDFORWARDS = {"relu": ("standard", "relu"), "softmax": ("softmax", "relu"), "sigmoid": ("gated", "relu")}

# Key renames per task: (the authors' key pattern, energyzoo's key in the encoder ``model.``, or with a leading "/"
# in the head; None: a key the converted model does not use).
_IC_KEYS = [
    (r"emb\.(\d)\.(weight|bias)", r"embeddings.patch_embeddings.\1.\2"),
    (r"cls_token", r"embeddings.cls_token"),
    (r"enc\.(\d+)\.attn\.qkv\.weight", r"layers.\1.qkv_proj.weight"),
    (r"enc\.(\d+)\.attn\.ln1_1\.weight", r"layers.\1.qkv_norms.0.weight"),
    (r"enc\.(\d+)\.attn\.ln1_2\.weight", r"layers.\1.qkv_norms.1.weight"),
    (r"enc\.(\d+)\.attn\.ln1_3\.weight", r"layers.\1.qkv_norms.2.weight"),
    (r"enc\.(\d+)\.mlp\.weight", r"layers.\1.ff_proj.weight"),
    (r"enc\.(\d+)\.ln2\.weight", r"layers.\1.ff_norm.weight"),
    (r"enc\.(\d+)\.time_mlp_inner\.0\.weight", r"layers.\1.step_head.head_norm.weight"),
    (r"enc\.(\d+)\.time_mlp_inner\.2\.(weight|bias)", r"layers.\1.step_head.out_proj.\2"),
    (r"enc\.(\d+)\.ln_inp\.weight", r"layers.\1.step_head.condition_norm.weight"),
    # the shared network: [sinusoid, Linear, RMSNorm, GELU, RMSNorm, Linear, RMSNorm] (time_mlp.0 in a ModuleList,
    # or time_mlp itself in the alternative models), then the head [[RMSNorm,] GELU, Linear] (time_mlp.1)
    (r"time_mlp\.(?:0\.)?([1-6])\.(weight|bias)", lambda m: f"step_sizes.time_mlp.{int(m[1]) - 1}.{m[2]}"),
    (r"time_mlp\.1\.0\.weight", r"step_sizes.head_norm.weight"),
    (r"time_mlp\.1\.[12]\.(weight|bias)", r"step_sizes.out_proj.\1"),
    (r"ln_inp\.weight", r"step_sizes.condition_norm.weight"),
    (r"fc\.0\.(weight|bias)", r"/norm.\1"),
    (r"fc\.1\.(weight|bias)", r"/classifier.\1"),
]
_SUDOKU_KEYS = [
    (r"tok_emb\.weight", r"embeddings.token_embeddings.weight"),
    (r"pos_emb", r"embeddings.position_embeddings"),
    (r"blocks\.(\d+)\.attn\.qkv\.weight", r"layers.\1.qkv_proj.weight"),
    (r"blocks\.(\d+)\.attn\.ln1\.weight", r"layers.\1.qkv_norms.0.weight"),
    (r"blocks\.(\d+)\.mlp\.weight", r"layers.\1.ff_proj.weight"),
    (r"blocks\.(\d+)\.ln2\.weight", r"layers.\1.ff_norm.weight"),
    (r"blocks\.(\d+)\.attn\.mask", None),  # a causal-mask buffer the Hyper-SET attention never applies
    (r"time_mlp\.0\.1\.(weight|bias)", r"step_sizes.time_mlp.0.\1"),
    (r"time_mlp\.0\.3\.(weight|bias)", r"step_sizes.time_mlp.4.\1"),
    (r"time_mlp\.1\.1\.(weight|bias)", r"step_sizes.out_proj.\1"),
    (r"ln_f\.weight", r"/norm.weight"),
    (r"head\.weight", r"/classifier.weight"),
]
_MIM_KEYS = [
    (r"tok_emb\.weight", r"embeddings.token_embeddings.weight"),
    (r"transformer\.qkv\.weight", r"layers.0.qkv_proj.weight"),
    (r"transformer\.ln1\.weight", r"layers.0.qkv_norms.0.weight"),
    (r"transformer\.mlp\.weight", r"layers.0.ff_proj.weight"),
    (r"transformer\.ln2\.weight", r"layers.0.ff_norm.weight"),
    (r"transformer\.time_mlp\.1\.0\.weight", r"step_sizes.head_norm.weight"),
    (r"transformer\.time_mlp\.1\.2\.(weight|bias)", r"step_sizes.out_proj.\1"),
    (r"lm_head\.0\.weight", r"/norm.weight"),
    (r"lm_head\.1\.(weight|bias)", r"/classifier.\1"),
]
ORIGINAL_KEYS = {"image-classification": _IC_KEYS, "token-classification": _SUDOKU_KEYS,
                 "masked-image-modeling": _MIM_KEYS}
_LORA = re.compile(r"deltaW_(attention|ff)_([AB])\.(\d+)")
_LORA_TARGETS = {("attention", "A"): "qkv_down", ("attention", "B"): "qkv_up", ("ff", "A"): "ff_down",
                 ("ff", "B"): "ff_up"}
# prefixes a training wrapper adds: DDP, torch.compile, a Lightning module
_WRAPPERS = ("module.", "_orig_mod.", "model.")


def read_original_state_dict(source: str | Path) -> dict[str, torch.Tensor]:
    """The model weights in an authors' checkpoint: ``.safetensors``, or a ``.pt`` / ``.pth`` holding the bare state
    dict, their trainers' ``{"model_state_dict": ...}`` or a Lightning ``{"state_dict": ...}`` (read with
    ``weights_only=True``: no code runs), wrapper prefixes (DDP ``module.``, ``_orig_mod.``, Lightning ``model.``)
    removed."""
    path = Path(source)
    if not path.is_file():
        raise UserError(f"hyperset-original: no checkpoint file at {path}")
    try:  # what fails here is the file, whatever its reader raises: truncated, overwritten, text, another format
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch's unpickler raises IndexError, KeyError, ... for a text file
        kind = "safetensors" if path.suffix == ".safetensors" else "torch"
        raise UserError(f"hyperset-original: {path} is not a {kind} checkpoint that loads ({_reader_reason(error)}): "
                        "truncated, overwritten or another format?") from None
    for wrapper in ("model_state_dict", "state_dict"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(torch.is_tensor(value) for value in state.values()):
        raise UserError(f"hyperset-original: {path} holds no state dict (a mapping of names to tensors)")
    for prefix in _WRAPPERS:
        if state and all(key.startswith(prefix) for key in state):
            state = {key[len(prefix):]: value for key, value in state.items()}
    return state


def _reader_reason(error: Exception) -> str:
    """The reader's own reason in a few words: the unpickler's error of torch's weights-only notice (which opens with a
    paragraph on ``weights_only``), else the first line, shortened at a word."""
    text = str(error).strip()
    text = text.split("WeightsUnpickler error:", 1)[-1].strip() if "WeightsUnpickler error:" in text else text
    first = (text.splitlines() or [""])[0]
    return textwrap.shorten(first, 120, placeholder=" ...") if first else type(error).__name__


def original_task(state: dict[str, torch.Tensor]) -> str:
    """The task whose model the state dict is: its embedding names it."""
    for key, task in (("emb.1.weight", "image-classification"), ("blocks.0.attn.qkv.weight", "token-classification"),
                      ("transformer.qkv.weight", "masked-image-modeling")):
        if key in state:
            return task
    raise UserError("hyperset-original: this state dict is none of the authors' Hyper-SET models (no emb.1.weight, "
                    "blocks.0.attn.qkv.weight or transformer.qkv.weight)")


def _option(options: dict, defaults_taken: dict, task: str, name: str):
    if name in options:
        return options[name]
    defaults_taken[name] = ORIGINAL_DEFAULTS[task][name]
    return defaults_taken[name]


def _refuse(name: str, value, allowed) -> UserError:
    return UserError(f"hyperset-original: the option {name}={value!r} has no energyzoo equivalent; "
                     f"energyzoo converts {sorted(allowed, key=str)}")


def _update_fields(mode: str) -> tuple[dict, tuple[float, float] | None]:
    if mode not in ADAPTIVE_MODES:
        raise _refuse("adaptive_mode", mode, ADAPTIVE_MODES)
    update_mode, fixed = ADAPTIVE_MODES[mode]
    return {"update_mode": update_mode}, fixed


def _layers(state: dict, pattern: str) -> int:
    return len({match[1] for key in state if (match := re.fullmatch(pattern, key))})


def _image_classification_type(state, given: str | None) -> str:
    """The authors' ``model.type`` the state dict is (the two alternative models have the same keys: ``given``
    tells them apart), checked against ``given``."""
    if "enc.0.time_mlp_inner.2.weight" in state:
        if given not in ("hyper-set-alt-attn", "hyper-set-alt-ff"):
            raise UserError("hyperset-original: this state dict is an alternative model (enc.0.time_mlp_inner): pass "
                            "type=hyper-set-alt-attn or type=hyper-set-alt-ff, the type it was trained as "
                            f"(got {given!r})")
        return given
    kind = ("hyper-set-ss" if "time_mlp.0.1.weight" not in state
            else "hyper-set-lora" if "deltaW_attention_A.0" in state
            else "hyper-set-basic" if "time_mlp.1.0.weight" in state else "hyper-set")
    if given not in (None, kind):
        raise UserError(f"hyperset-original: the state dict is a {kind} model, not the type={given!r} given")
    return kind


def _image_classification_fields(state, options, taken) -> dict:
    task = "image-classification"
    width, features = state["emb.1.weight"].shape
    kind = _image_classification_type(state, options.get("type"))
    alternative = kind in ("hyper-set-alt-attn", "hyper-set-alt-ff")
    fields = dict(input_type="patches", hidden_size=width, num_hidden_layers=_layers(state, r"enc\.(\d+)\..*"),
                  intermediate_size=state["enc.0.mlp.weight"].shape[0],
                  num_attention_heads=width // state["enc.0.attn.ln1_1.weight"].shape[0], qkv_norm="separate",
                  patch_size=math.isqrt(features // 3), num_channels=3, use_cls_token="cls_token" in state,
                  position_embedding_type="sinusoidal", num_labels=state["fc.1.weight"].shape[0], hidden_act="gelu")
    dataset = _option(options, taken, task, "dataset")  # with ``size``, it still names the normalisation
    if dataset not in ORIGINAL_DATASETS:
        raise _refuse("dataset", dataset, ORIGINAL_DATASETS)
    fields["image_size"] = options.get("size") or ORIGINAL_DATASETS[dataset][0]
    if kind == "hyper-set-ss":
        fields.update(step_size_mode="fixed", fixed_step_size=float(_option(options, taken, task, "step_size")))
    else:
        input_cond = _option(options, taken, task, "input_cond")
        if alternative and input_cond:  # their loop then restarts every iteration from x(0): no conditioning
            raise _refuse("input_cond", input_cond, [False])
        fields.update(time_embed_dim=state["time_mlp.0.1.weight" if not alternative else "time_mlp.1.weight"].shape[1],
                      step_net_rmsnorm=True, step_condition="input" if input_cond else "current",
                      step_condition_rmsnorm=True, step_head_rmsnorm=kind == "hyper-set-basic" or alternative,
                      step_head_per_layer=alternative)
    if kind == "hyper-set-alt-attn":
        attention = _option(options, taken, task, "attention")
        if attention not in ALTERNATIVE_ATTENTIONS:
            raise _refuse("attention", attention, ALTERNATIVE_ATTENTIONS)
        fields["attention_type"] = ALTERNATIVE_ATTENTIONS[attention]
    if kind == "hyper-set-alt-ff":
        ff = _option(options, taken, task, "ff")
        if ff not in ALTERNATIVE_FEEDFORWARDS:
            raise _refuse("ff", ff, ALTERNATIVE_FEEDFORWARDS)
        fields["ff_type"], fields["hidden_act"] = ALTERNATIVE_FEEDFORWARDS[ff]
    lora_steps = _layers(state, r"deltaW_attention_A\.(\d+)")
    if lora_steps:
        fields.update(lora_rank=state["deltaW_attention_A.0"].shape[0], num_iterations=lora_steps,
                      lora_alpha=_option(options, taken, task, "lora_alpha"))
    else:
        fields["num_iterations"] = _option(options, taken, task, "n_recur")
    return fields


def _sudoku_fields(state, options, taken) -> dict:
    task = "token-classification"
    vocab, width = state["tok_emb.weight"].shape
    update, fixed = _update_fields(_option(options, taken, task, "adaptive_mode"))
    input_cond = _option(options, taken, task, "input_cond")
    learned = "pos_emb" in state
    cells = state["pos_emb"].shape[1] if learned else options.get("block_size", 81)
    return dict(input_type="tokens", vocab_size=vocab, hidden_size=width, max_position_embeddings=cells,
                num_hidden_layers=_layers(state, r"blocks\.(\d+)\..*"),
                intermediate_size=state["blocks.0.mlp.weight"].shape[0],
                num_attention_heads=width // state["blocks.0.attn.ln1.weight"].shape[0], qkv_norm="shared",
                use_cls_token=False, position_embedding_type="learned" if learned else "sincos2d",
                num_labels=state["head.weight"].shape[0], hidden_act="relu", embedding_dropout=0.1,
                time_embed_dim=state["time_mlp.0.1.weight"].shape[1],
                step_condition="input" if input_cond else "current", step_condition_rmsnorm=False,
                num_iterations=_option(options, taken, task, "n_recur"), **update)


def _maskgit_fields(state, options, taken) -> dict:
    task = "masked-image-modeling"
    vocab, width = state["tok_emb.weight"].shape
    update, fixed = _update_fields(_option(options, taken, task, "adaptive_mode"))
    phi = _option(options, taken, task, "phi_func")
    if phi not in (None, "sigmoid"):
        raise _refuse("phi_func", phi, [None, "sigmoid"])
    grid = _option(options, taken, task, "img_size") // 16  # the VQGAN's 16x downsampling
    fields = dict(input_type="tokens", vocab_size=vocab, codebook_size=vocab - 1, mask_token_id=vocab - 1,
                  hidden_size=width, max_position_embeddings=grid * grid, num_hidden_layers=1,
                  intermediate_size=state["transformer.mlp.weight"].shape[0],
                  num_attention_heads=width // state["transformer.ln1.weight"].shape[0], qkv_norm="shared",
                  use_cls_token=False, position_embedding_type="sincos2d", hidden_act="relu", time_embed_dim=0,
                  step_head_rmsnorm=True, step_condition="input", step_condition_rmsnorm=False,
                  num_iterations=_option(options, taken, task, "n_recur"), **update)
    if phi is not None:  # their phi_func swaps both energies: linear attention (T^-1/2) and the gated feed-forward
        fields.update(attention_type="linear", linear_attention_scale="tokens", ff_type="gated")
    if fixed is not None:
        fields.update(step_size_mode="fixed", fixed_step_size=fixed[0], fixed_feedforward_step_size=fixed[1])
    return fields


FIELD_READERS = {"image-classification": _image_classification_fields, "token-classification": _sudoku_fields,
                 "masked-image-modeling": _maskgit_fields}


def original_weights(state: dict[str, torch.Tensor], task: str, learned_steps: bool = True) -> dict[str, torch.Tensor]:
    """The authors' state dict under the energyzoo head's names (the encoder's under ``model.``); the LoRA factors
    stacked over iterations. Keys of the step-size network are dropped when the converted
    model has none (``learned_steps`` False: MaskGIT's fixed-step modes keep an unused network). Unknown keys are
    refused by name."""
    weights, lora, unknown = {}, {}, []
    for key, value in state.items():
        if match := _LORA.fullmatch(key):
            lora.setdefault(_LORA_TARGETS[match[1], match[2]], {})[int(match[3])] = value
            continue
        for pattern, target in ORIGINAL_KEYS[task]:
            if match := re.fullmatch(pattern, key):
                if target is not None and (learned_steps or "step_sizes." not in target):
                    name = match.expand(target) if isinstance(target, str) else target(match)
                    weights[name[1:] if name.startswith("/") else "model." + name] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise UserError(f"hyperset-original: keys the authors' {task} model does not have, refused: "
                        f"{', '.join(sorted(unknown))}")
    for name, factors in lora.items():
        weights[f"model.depthwise_lora.{name}"] = torch.stack([factors[r] for r in sorted(factors)])
    return weights


def convert_original(state: dict[str, torch.Tensor], task: str | None = None, options: dict | None = None,
                     ) -> tuple[HyperSETConfig, dict[str, torch.Tensor], dict]:
    """(config, the head's state dict, the options taken from the authors' defaults) of an authors' checkpoint;
    ``task`` (checked against the state dict) is read from it when None; ``options`` are the authors' task
    options (their YAML's ``model`` and ``data`` keys)."""
    found = original_task(state)
    if task is not None and task != found:
        raise UserError(f"hyperset-original: this state dict is the authors' {found} model, not a {task} one")
    options, taken = dict(options or {}), {}
    config = HyperSETConfig(**FIELD_READERS[found](state, options, taken))
    weights = original_weights(state, found, learned_steps=config.step_size_mode == "learned")
    return config, weights, taken


def load_hyperset_original(source, output_loading_info: bool = False, **options):
    """The energyzoo head of an authors' Hyper-SET checkpoint's task (huyunzhe/hyper-set; image classification,
    Sudoku or MaskGIT), with its weights: ``source`` a ``.safetensors`` / ``.pt`` / ``.pth`` file or a state dict,
    ``options`` the authors' task options in their names (``n_recur``, ``input_cond``, ``adaptive_mode``, ``type``,
    ``dataset`` or ``size``, ``lora_alpha``, ``attention``, ``ff``, ``phi_func``, ``img_size``) where the state dict
    cannot say them; each one not given takes the authors' shipped default, and a warning names it (with
    ``output_loading_info``, as `from_pretrained` has it, ``(model, {"defaults_taken": ...})`` is returned instead).
    Loaded strictly, in eval mode."""
    state = source if isinstance(source, dict) else read_original_state_dict(source)
    config, weights, defaults = convert_original(state, None, options)
    head = ARCHITECTURES["hyperset"].heads[original_task(state)]
    if defaults and not output_loading_info:
        logger.warning(f"load_hyperset_original: not in the state dict and not given, the authors' defaults taken: "
                       f"{defaults}")
    model = head(config)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise UserError(f"load_hyperset_original: the converted weights do not fit the {head.__name__} built from "
                        f"them (missing {missing}, unexpected {unexpected})")
    return (model.eval(), {"defaults_taken": defaults}) if output_loading_info else model.eval()
