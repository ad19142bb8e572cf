"""The one config check of the zoo: a `ValueError` that names the field, the value and what is allowed.

Every config and settings class (model configs, `TELSettings`, the run recipes) checks its values with
`require`, once per construction: under huggingface_hub's ``@strict``, every method named ``validate_*``
becomes a class validator that runs after ``__init__``, so a config has exactly one such method and helpers
it calls are named otherwise. The zoo's configs are declared with `strict_config` (``@strict`` whose errors read as
one-line `TypeError` / `ValueError`), and run `check_transformers_fields` on the fields transformers defines
(inherited, or declared under transformers' names) before their own checks, and `check_derived_fields` after
transformers' ``__post_init__``.

Every configuration file imports this one, so an exported folder's code starts here: it refuses, in one line, a
transformers release outside the range the code was tested on (`transformers_compat.TESTED_TRANSFORMERS`).
"""

import dataclasses
import functools

import torch
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .errors import UserError, UserTypeError, require  # noqa: F401 - require: the config files' check
from .transformers_compat import check_transformers_release

check_transformers_release()

# Sizes and counts under transformers' names (Llama, GPT-2, ViT, ResNet and the zoo's own configs use them): positive
# integers where set (None where the config's default is None, e.g. num_key_value_heads, n_inner).
POSITIVE_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "max_position_embeddings", "n_positions", "n_embd", "n_layer",
                  "n_head", "n_inner", "num_channels", "embedding_size", "image_size", "patch_size", "encoder_stride",
                  "pooler_output_size")
ACTIVATIONS = ("hidden_act", "activation_function", "pooler_act")
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")
ROPE_TYPES = {"default", *ROPE_INIT_FUNCTIONS}
FLOAT32_TINY, FLOAT32_MAX = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
FLOAT32_NUMBER = f"a finite number float32 holds (0, or of size in [{FLOAT32_TINY:.3g}, {FLOAT32_MAX:.3g}])"
# PreTrainedConfig's own fields: their annotations are strings, which huggingface_hub's @strict does not check, and
# transformers' __post_init__ reads them as what they should be (id2label.items(), getattr(torch, dtype)).
BASE_FIELDS = {
    "output_hidden_states": (lambda value: value in (None, True, False), "True, False or None"),
    "return_dict": (lambda value: value in (None, True, False), "True, False or None"),
    "is_encoder_decoder": (lambda value: value is False, "False (a zoo model is no encoder-decoder)"),
    "chunk_size_feed_forward": (lambda value: _is_integer(value) and value >= 0, "an integer >= 0"),
    "id2label": (lambda value: value is None or (isinstance(value, dict) and all(
        str(key).lstrip("-").isdigit() for key in value)), "None or a dict of class ids to names"),
    "label2id": (lambda value: value is None or isinstance(value, dict), "None or a dict"),
    "problem_type": (lambda value: value in PROBLEM_TYPES, f"one of {PROBLEM_TYPES}"),
    "dtype": (lambda value: value is None or isinstance(value, torch.dtype) or (
        isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)), "None or a torch dtype"),
    "architectures": (lambda value: value is None or (isinstance(value, list) and all(
        isinstance(name, str) for name in value)), "None or a list of class names"),
    "transformers_version": (lambda value: value is None or isinstance(value, str), "None or a version string"),
}


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _held_by_float32(value: float) -> bool:
    """Whether float32, which the models compute in (or narrower), holds ``value``: others become 0 or inf there."""
    return value == 0 or FLOAT32_TINY <= abs(value) <= FLOAT32_MAX


def _is_probability_field(name: str) -> bool:
    return "dropout" in name or name.endswith(("_pdrop", "_prob"))


def check_transformers_fields(config) -> None:
    """The fields a zoo config shares with transformers' configs, by what their names mean there: every float
    finite and held by float32; sizes and counts (`POSITIVE_SIZES`) positive integers; epsilons (``*_eps``,
    ``*_epsilon``) positive;
    dropout probabilities in [0, 1); ``initializer_range`` in (0, 1]; activations known to transformers; the pad token
    id inside the vocabulary. transformers itself checks none of these ranges (it only warns about token ids), and a
    NaN epsilon reaches the logits as NaN. Run before the config derives anything from them (Llama's head_dim divides
    by the head count); `check_derived_fields` follows transformers' ``__post_init__``."""
    owner = type(config).__name__
    defaults = {field.name: field.default for field in dataclasses.fields(config)}
    for name, default in defaults.items():
        value = getattr(config, name)
        if isinstance(value, float):
            require(owner, _held_by_float32(value), name, FLOAT32_NUMBER, value)
        if _is_probability_field(name):  # Llama's attention_dropout may be None, which its training pass cannot take
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            require(owner, number and 0 <= value < 1, name, "a probability in [0, 1)", value)
        elif value is None:
            continue
        elif name in POSITIVE_SIZES:
            entries = value if isinstance(value, (list, tuple)) else [value]
            positive = bool(entries) and all(_is_integer(entry) and entry > 0 for entry in entries)
            require(owner, positive, name, "a positive integer" + (" or None" if default is None else ""), value)
        elif name.endswith(("_eps", "_epsilon")):
            require(owner, value > 0, name, "> 0", value)
        elif name == "initializer_range":  # the std of the weights' N(0, std) initialisation
            require(owner, 0 < value <= 1, name, "in (0, 1]", value)
        elif name in ACTIVATIONS:
            # imported here: transformers.activations loads its kernel hub (~2 s), which defining a config need not
            from transformers.activations import ACT2FN

            require(owner, value in ACT2FN, name, "an activation of transformers' ACT2FN", value)
    for name, (valid, allowed) in BASE_FIELDS.items():
        require(owner, valid(getattr(config, name)), name, allowed, getattr(config, name))
    vocab_size, pad = getattr(config, "vocab_size", None), getattr(config, "pad_token_id", None)
    if vocab_size is not None:  # the embedding's padding_idx. (bos / eos outside it: transformers warns, as Hub configs
        # hold such ids; generation never meets them, and the models refuse them as input ids)
        require(owner, pad is None or 0 <= pad < vocab_size, "pad_token_id",
                f"None or an id in [0, vocab_size={vocab_size})", pad)


def check_derived_fields(config) -> None:
    """What transformers' ``__post_init__`` sets from its arguments, checked after it: at least one label
    (``num_labels=`` becomes ``id2label``), and RoPE parameters finite with a positive base ``rope_theta`` and scaling
    ``factor`` (legacy ``rope_theta=`` / ``rope_scaling=`` arguments move into ``rope_parameters``; a NaN base reaches
    the logits as NaN, and transformers checks the names, not the values)."""
    owner = type(config).__name__
    require(owner, config.num_labels >= 1, "num_labels", ">= 1 (the size of id2label)", config.num_labels)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict):
        scales = [rope[key] for key in ("rope_theta", "factor") if key in rope]
        valid = all(isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 for value in scales)
        valid = valid and all(_held_by_float32(value) for value in rope.values() if isinstance(value, float))
        require(owner, valid, "rope_parameters", f"numbers with rope_theta > 0 and factor > 0, each {FLOAT32_NUMBER}",
                rope)
        require(owner, rope.get("rope_type") in ROPE_TYPES, "rope_parameters",
                f"a rope_type of {sorted(ROPE_TYPES)}", rope)


def require_sizes(owner: str, condition: bool, fields: dict, gives: str) -> None:
    """A rule over several size fields, any of which may be the one the user set, so the message names them all with
    their values: ``UserError("<owner>: hidden_size 100, value_ratio 0.5 and num_attention_heads 4 give <gives>")``
    unless ``condition`` holds."""
    if not condition:
        named = [f"{field} {value!r}" for field, value in fields.items()]
        raise UserError(f"{owner}: {', '.join(named[:-1])} and {named[-1]} give {gives}")


def require_divisible(owner: str, config, size: str, heads: str) -> None:
    """``config.<size>`` is a multiple of ``config.<heads>`` (attention heads split a width evenly)."""
    width, count = getattr(config, size), getattr(config, heads)
    require(owner, width % count == 0, heads, f"a divisor of {size} ({width})", count)


def _one_line(error: Exception, owner: str) -> Exception:
    """huggingface_hub's two-line strict error as the `TypeError` / `ValueError` it wraps, on one line naming the
    config and, for a field's type check, the field."""
    cause = error.__cause__
    kind = UserTypeError if isinstance(cause, TypeError) else UserError
    if isinstance(error, StrictDataclassFieldValidationError):
        field = str(error).split("'")[1]  # "Validation error for field '<name>':"
        return kind(f"{owner}.{field}: {cause}")
    return kind(str(cause) if str(cause).startswith(owner) else f"{owner}: {cause}")


def strict_config(cls):
    """huggingface_hub's ``@strict`` (every field's type checked on assignment, ``validate_*`` methods run after
    ``__init__``), with its errors raised as the `TypeError` or `ValueError` they wrap, on one line that names the
    config and the field (``@strict`` raises its own exception class over two lines, which command lines cut), and
    the `KeyError` of transformers' RoPE validator as a `ValueError`."""
    cls = strict(cls)
    init, setattr_ = cls.__init__, cls.__setattr__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except (StrictDataclassFieldValidationError, StrictDataclassClassValidationError) as error:
            raise _one_line(error, cls.__name__) from error
        except KeyError as error:  # transformers' validate_rope names missing RoPE keys with a KeyError
            raise UserError(f"{cls.__name__}: {error.args[0]}") from error

    @functools.wraps(setattr_)
    def __setattr__(self, name, value):
        try:
            setattr_(self, name, value)
        except StrictDataclassFieldValidationError as error:
            raise _one_line(error, cls.__name__) from error

    cls.__init__, cls.__setattr__ = __init__, __setattr__
    return cls


class OwnCacheLayerTypes:
    """A config whose ``layer_types`` name the model's own cache layers (registered with transformers' cache tables, so
    `DynamicCache(config=...)` and `StaticCache(config=...)` build them). They follow from other fields: set by
    `set_cache_layer_types` in ``__post_init__``, not validated against transformers' attention layer types, and not
    saved (transformers' generic config, which `AutoTokenizer` reads where it may not run the model's file, rejects
    layer types it does not know)."""

    def validate_layer_type(self):
        """The zoo's cache-layer types (set in ``__post_init__``) are not transformers' attention layer types."""

    def to_dict(self) -> dict:
        output = super().to_dict()
        output.pop("layer_types", None)
        return output


def set_cache_layer_types(config, owner: str, layer_types: list[str], reason: str) -> None:
    """Set ``config.layer_types``, refusing a different value a user passed."""
    require(owner, config.layer_types in (None, layer_types), "layer_types", f"None or {layer_types} ({reason})",
            config.layer_types)
    config.layer_types = layer_types
