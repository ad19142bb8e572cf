"""The decoding state EqT-LLaMA keeps besides Llama's keys and values: the recent token window its energies read.

Eq. 12-13 score the tokens of a window before each refined position, and the reverse encoder's state before the
window's first token reaches `EqTLlamaConfig.erm_context_length` positions back. A decoding step receives only its
new tokens, so the cache carries that many recent ids (with their real-token flags and their positions among the real
tokens) in the first decoder layer's cache layer (`configuration_eqt.WINDOW_LAYER_TYPE` in ``config.layer_types``):
a cache has one layer per decoder layer, `DynamicCache(config=...)` and `StaticCache(config=...)` build it, and
`generate()` (beam search included) and hand-written cached loops need nothing more. The window always has
``erm_context_length`` slots (before that many tokens were seen, the first are empty and flagged as padding), so its
shape never changes and a static cache keeps it at fixed addresses.
"""

import torch
from transformers.cache_utils import DynamicLayer, StaticLayer

from .caches import CacheStatesMixin
from .configuration_eqt import WINDOW_LAYER_TYPE


class TokenWindow(CacheStatesMixin):
    """The last `erm_context_length` token ids of each sequence, their real-token flags and keys (index among the
    real tokens), and the number of real tokens seen, beside the layer's keys and values. It cannot be cropped: the
    tokens before the window are not kept (`generate()` refuses assisted decoding up front, as for other stateful
    models)."""

    _layer_type = WINDOW_LAYER_TYPE
    state_names = ("ids", "valid", "keys_seen", "real_seen")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ids: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        self.keys_seen: torch.Tensor | None = None
        self.real_seen: torch.Tensor | None = None

    def states(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.valid, self.keys_seen, self.real_seen

    def store(self, ids, valid, keys, real_seen, keep: int) -> None:
        for name, state in (("ids", ids), ("valid", valid), ("keys_seen", keys)):
            self.keep(name, state[:, -keep:])
        self.keep("real_seen", real_seen)


class EqTWindowLayer(TokenWindow, DynamicLayer):
    __doc__ = TokenWindow.__doc__


class EqTStaticWindowLayer(TokenWindow, StaticLayer):
    __doc__ = TokenWindow.__doc__
    keeps_in_place = True


WINDOW_LAYERS = (EqTWindowLayer, EqTStaticWindowLayer)
