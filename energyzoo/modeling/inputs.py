"""What every zoo model checks of its inputs before any kernel runs: a batch of at least one sequence of at least one
token (or one image), ids inside the vocabulary, a 2-D attention mask of 0s and 1s covering the cached and new tokens,
pixel values of the configured channels and size, labels of the task's classes; and the causal-LM loss, which is 0
rather than NaN where no token is labelled. A bad input gets a `ValueError` that
names it and says what is allowed, instead of an index error inside torch (or a device-side assert on a GPU), an
empty output or a silently wrong one. An attention mask may zero a whole row: that row's outputs are finite and
meaningless, as in transformers' models.

The value checks (ids, mask entries, labels, the tokens a cache holds) read tensors, which on an accelerator waits for
them once per check; while torch.compile traces they are skipped (the shapes of the inputs are still checked).
"""

from dataclasses import dataclass

import torch
from transformers.loss.loss_utils import ForCausalLMLoss

from .errors import UserError

IGNORE_INDEX = -100  # transformers' loss functions skip this label
ID_DTYPES = (torch.long, torch.int)  # what nn.Embedding takes
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class InputKind:
    """What a model input may be: its dtypes and number of dimensions, said in ``allowed`` (the error's words)."""

    dtypes: tuple[torch.dtype, ...]
    dims: tuple[int, ...]
    allowed: str


# Every input the zoo's models check, by name: the one table the checks below and the fuzz tests read. Images of any
# float dtype are cast to the model's (as transformers' ViT does); ids, labels and masks are integers.
INPUT_KINDS = {
    "input_ids": InputKind(ID_DTYPES, (2,), "a (batch, sequence) tensor of torch.long or torch.int ids"),
    "pixel_values": InputKind(FLOAT_DTYPES, (4,), "a float tensor (batch, channels, height, width)"),
    "labels": InputKind((torch.long,), (1, 2), "integer class ids (torch.long, what cross-entropy takes)"),
    "bool_masked_pos": InputKind((torch.bool, *ID_DTYPES), (2,), "a (batch, cells) tensor of booleans or 0/1"),
}


def check_kind(owner: str, name: str, tensor: torch.Tensor, shape: tuple[int, ...] | None = None,
               allowed: str | None = None) -> None:
    """``tensor`` is of the `INPUT_KINDS` kind of ``name`` (and of ``shape`` where given); ``allowed`` replaces the
    table's words where the caller says more (the configured image size)."""
    kind = INPUT_KINDS[name]
    fits = tensor.dtype in kind.dtypes and tensor.dim() in kind.dims
    allowed = allowed or kind.allowed + (f" of shape {tuple(shape)}" if shape is not None else "")
    refuse_input(owner, fits and (shape is None or tuple(tensor.shape) == tuple(shape)), name, allowed,
                 _described(tensor))


def refuse_input(owner: str, condition: bool, name: str, allowed: str, got) -> None:
    """Raise ``UserError("<owner>: <name> must be <allowed>, got <got>")`` unless ``condition`` holds."""
    if not condition:
        raise UserError(f"{owner}: {name} must be {allowed}, got {got}")


def _described(tensor: torch.Tensor) -> str:
    return f"{tuple(tensor.shape)} {tensor.dtype}"


def values_checked() -> bool:
    return not torch.compiler.is_compiling()


def _bounds(tensor: torch.Tensor) -> tuple[int, int]:
    low, high = torch.stack(torch.aminmax(tensor.long())).tolist()  # one synchronisation for both
    return low, high


def cached_tokens(cache) -> int:
    """How many tokens ``cache`` holds (0 without one). A static cache keeps the count in a tensor: read it outside
    torch.compile's tracing only."""
    return int(cache.get_seq_length()) if cache is not None else 0


def check_token_inputs(owner: str, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
                       attention_mask: torch.Tensor | None, vocab_size: int, hidden_size: int, cache=None) -> None:
    """Exactly one of ``input_ids`` (batch, length) with ids in [0, vocab_size) and ``inputs_embeds``
    (batch, length, hidden_size) floats, batch and length >= 1; an ``attention_mask`` of 0s and 1s, 2-D over the tokens
    of the ``cache`` and the new ones, or 4-D (a custom mask, taken as it is)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise UserError(f"{owner}: pass exactly one of input_ids or inputs_embeds")
    if input_ids is not None:
        name, tokens = "input_ids", input_ids
        check_kind(owner, name, input_ids)
    else:
        name, tokens = "inputs_embeds", inputs_embeds
        refuse_input(owner, inputs_embeds.dim() == 3 and inputs_embeds.is_floating_point()
                     and inputs_embeds.shape[-1] == hidden_size, name,
                     f"a (batch, sequence, {hidden_size}) float tensor", _described(inputs_embeds))
    batch, length = tokens.shape[:2]
    refuse_input(owner, batch >= 1 and length >= 1, name, "at least one sequence of at least one token",
                 f"shape {tuple(tokens.shape)}")
    if attention_mask is not None:
        refuse_input(owner, attention_mask.dim() in (2, 4), "attention_mask",
                     "2-D (batch, cached + new tokens) or a 4-D custom mask", _described(attention_mask))
        if attention_mask.dim() == 2 and values_checked():
            covered = cached_tokens(cache) + length
            refuse_input(owner, tuple(attention_mask.shape) == (batch, covered), "attention_mask",
                         f"of shape ({batch}, {covered}): the cached and the {length} new tokens",
                         tuple(attention_mask.shape))
            binary = bool(((attention_mask == 0) | (attention_mask == 1)).all())
            refuse_input(owner, binary, "attention_mask", "0s and 1s (1: a real token)", "other values")
    if input_ids is not None and values_checked():
        low, high = _bounds(input_ids)
        refuse_input(owner, 0 <= low and high < vocab_size, "input_ids", f"ids in [0, vocab_size={vocab_size})",
                     f"ids in [{low}, {high}]")


def check_unpadded(owner: str, attention_mask: torch.Tensor | None, reason: str) -> None:
    """A model without a padding mask takes an ``attention_mask`` only if it masks nothing (all ones), so that padded
    inputs are refused instead of read as real tokens."""
    if attention_mask is not None and values_checked():
        refuse_input(owner, bool((attention_mask == 1).all()), "attention_mask", f"None or all ones ({reason})",
                     "a mask with zeros")


def check_pixel_values(owner: str, pixel_values: torch.Tensor | None, num_channels: int,
                       image_size: int | tuple[int, int] | None = None, smallest: int = 1) -> None:
    """``pixel_values`` (batch >= 1, num_channels, height, width) floats: ``image_size`` square (or (height, width))
    if the model needs that size, else at least ``smallest`` pixels a side."""
    if pixel_values is None:
        raise UserError(f"{owner}: pass pixel_values")
    if image_size is None:
        sides, allowed_sides = None, f"height >= {smallest}, width >= {smallest}" if smallest > 1 else "height, width"
    else:
        sides = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        allowed_sides = f"{sides[0]}, {sides[1]}"
    allowed = f"a float tensor of shape (batch >= 1, {num_channels}, {allowed_sides})"
    check_kind(owner, "pixel_values", pixel_values, allowed=allowed)
    batch, channels, height, width = pixel_values.shape
    fits = (height, width) == sides if sides is not None else min(height, width) >= smallest
    refuse_input(owner, batch >= 1 and channels == num_channels and fits, "pixel_values", allowed,
                 _described(pixel_values))


def check_labels(owner: str, labels: torch.Tensor | None, classes: int, shape: tuple[int, ...],
                 ignorable: bool = True) -> None:
    """Integer ``labels`` of ``shape`` in [0, classes), or (if ``ignorable``) -100 where nothing is to be predicted.
    (Float labels, of regression and multi-label classification, are the loss's to check.)"""
    if labels is None or labels.is_floating_point():
        return
    refuse_input(owner, tuple(labels.shape) == tuple(shape), "labels", f"of shape {tuple(shape)}",
                 f"shape {tuple(labels.shape)}")
    if values_checked() and labels.numel():
        low, high = _bounds(torch.where(labels == IGNORE_INDEX, 0, labels) if ignorable else labels)
        allowed = f"in [0, {classes})" + (f" or {IGNORE_INDEX} (ignored)" if ignorable else "")
        refuse_input(owner, 0 <= low and high < classes, "labels", allowed, f"labels in [{low}, {high}]")


def check_classifier_labels(owner: str, labels: torch.Tensor | None, config, batch: int) -> None:
    """Labels of a sequence or image classifier, where transformers' loss reads them as class ids (``num_labels``
    > 1, ``problem_type`` single-label classification): one integer per example, in [0, num_labels); no -100, which
    would leave a batch's mean loss over no example (NaN). With ``problem_type`` unset, float labels of shape
    (batch, num_labels) are multi-label targets, as in transformers; float labels of any other shape are refused
    (transformers would read them as multi-label targets and fail inside its loss)."""
    if labels is None or config.num_labels == 1 or config.problem_type not in (None, "single_label_classification"):
        return
    if labels.is_floating_point() and config.problem_type is None:
        refuse_input(owner, tuple(labels.shape) == (batch, config.num_labels), "labels",
                     f"integer class ids of shape ({batch},), or multi-label float targets of shape ({batch}, "
                     f"{config.num_labels})", _described(labels))
        return
    check_kind(owner, "labels", labels, (batch,))
    check_labels(owner, labels, config.num_labels, (batch,), ignorable=False)


class CausalLMLossMixin:
    """A causal LM whose `loss_function` is `causal_lm_loss` (transformers', 0 where no token is labelled) unless one
    is set, as for any transformers model."""

    @property
    def loss_function(self):
        return getattr(self, "_loss_function", causal_lm_loss)

    @loss_function.setter
    def loss_function(self, value):
        self._loss_function = value

    def head_logits_and_loss(self, hidden_states, labels, logits_to_keep, **loss_kwargs):
        """The LM head (``lm_head``) on the positions ``logits_to_keep`` keeps (transformers' int: the last ones, 0 for
        all; or an index tensor) and, with ``labels`` (checked against the vocabulary and ``hidden_states``' batch
        and length), their `loss_function` (None without labels)."""
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, kept, :])
        if labels is None:
            return logits, None
        check_labels(type(self).__name__, labels, self.config.vocab_size, hidden_states.shape[:2])
        return logits, self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size,
                                          **loss_kwargs)


def causal_lm_loss(logits, labels, vocab_size: int, **kwargs):
    """transformers' causal-LM loss (`ForCausalLMLoss`), 0 (not NaN) where no token is labelled after the shift (a
    single token, or every label -100): the mean over no token is NaN, which backward would spread into every weight.
    Labelled tokens are ``shift_labels`` where the caller aligned them itself, else ``labels[:, 1:]``."""
    targets = kwargs.get("shift_labels")
    targets = labels[..., 1:] if targets is None else targets
    value = ForCausalLMLoss(logits, labels, vocab_size, **kwargs)
    return torch.where((targets != IGNORE_INDEX).any(), value, torch.zeros_like(value))
