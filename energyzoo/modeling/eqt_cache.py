"""The decoding state EqT-LLaMA keeps besides Llama's keys and values: the recent token window its energies read.

Eq. 12-13 score the tokens of a window before each refined position, and the reverse encoder's state before the
window's first token reaches `EqTLlamaConfig.erm_context_length` positions back. A decoding step receives only its
new tokens, so the cache carries that many recent ids (with their padding flags and their positions among the
real tokens): `EqTLlamaModel` appends one `EqTContextLayer` after the decoder layers' cache layers, and since it
lives in the cache, `generate()` (beam search included) and hand-written cached loops need nothing more.
"""

import torch
from transformers.cache_utils import DummyLayer


class EqTContextLayer(DummyLayer):
    """The last `erm_context_length` token ids of each sequence, their real-token flags and keys (index among
    the real tokens), and the number of real tokens seen. It holds no keys or values, so transformers' cache
    utilities skip it where they look for attention layers."""

    is_croppable = False

    def __init__(self):
        super().__init__()
        self.ids: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        self.keys_seen: torch.Tensor | None = None
        self.real_seen: torch.Tensor | None = None

    def states(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.valid, self.keys_seen, self.real_seen

    def store(self, ids, valid, keys, real_seen, keep: int) -> None:
        self.ids, self.valid, self.keys_seen = ids[:, -keep:], valid[:, -keep:], keys[:, -keep:]
        self.real_seen = real_seen

    def _map(self, fn) -> None:
        if self.ids is not None:
            self.ids, self.valid, self.keys_seen, self.real_seen = (fn(state) for state in self.states())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map(lambda state: state.index_select(0, beam_idx.to(state.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda state: state.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda state: state[indices])

    def reset(self) -> None:
        self.ids = self.valid = self.keys_seen = self.real_seen = None

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("EqT's token window cannot be cropped: the tokens before it are not kept.")
