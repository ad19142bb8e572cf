"""The fixed-size decoding state of FEM-LM layers with a recurrent prior. Each prior's cache layer is in its
``fem_prior_<name>.py``; `DynamicCache(config=...)` and `StaticCache(config=...)` build them from
`config.layer_types` (each class registers its `_layer_type`)."""

import torch
from transformers.cache_utils import STATIC_LAYER_TYPE_MAPPING, CacheLayerMixin

from .caches import CacheStatesMixin


def fem_layer_type(prior: str) -> str:
    """Cache-layer type name of a FEM layer with this prior (each prior's cache layer registers its own)."""
    return f"fem_{prior}"


class FEMRecurrentCacheLayer(CacheStatesMixin, CacheLayerMixin):
    """Fixed-size decoding state of one FEM layer with a recurrent prior (FEM App. H.2-H.4): the prior's
    state (for GLA the decayed sums of k~ [v, exp(beta v - M)] and their shift M), the conditioner's
    state and the number of tokens seen. Its size does not grow with the sequence, so one class serves
    `DynamicCache` and `StaticCache` (registered in both, as transformers' linear-attention layers are) and compiled
    decoding: the states are copied in place and the token count is a tensor.

    What transformers' cache utilities see: ``keys`` / ``values`` stay None (``update`` refuses keys and values),
    ``get_seq_length`` / ``get_mask_sizes`` count the tokens seen, ``get_max_length`` is -1 (no length axis),
    ``is_initialized`` turns True with the first tokens, beam and batch edits move the states, ``reset`` empties
    them, and ``crop`` is refused (a recurrent state cannot be rewound). It is not one of transformers'
    linear-attention layers (its states are FEM's own tuples, not conv / SSM states), so ``Cache.has_previous_state``
    and ``get_recurrent_state`` refuse it, naming its type; early (key/value) initialisation does not apply."""

    is_compileable = True
    supports_early_init = False
    keeps_in_place = True
    state_names = ("time_decay_state", "prior_state")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls._layer_type is not None:  # fixed-size: the static table holds it too
            STATIC_LAYER_TYPE_MAPPING[cls._layer_type] = cls

    def __init__(self, **kwargs):
        super().__init__()
        self.time_decay_state: torch.Tensor | None = None
        self.prior_state: tuple[torch.Tensor, ...] | None = None
        self.cumulative_length = torch.zeros((), dtype=torch.long)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise NotImplementedError("recurrent FEM layers hold a state, not keys and values")

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("recurrent FEM layers hold a state, not keys and values; FEMAttention updates it")

    def advance(self, prior_state: tuple[torch.Tensor, ...], new_tokens: int) -> None:
        self.keep("prior_state", prior_state)
        if self.cumulative_length.device != prior_state[0].device:
            self.cumulative_length = self.cumulative_length.to(prior_state[0].device)
        self.cumulative_length.add_(new_tokens)
        self.is_initialized = True

    def get_seq_length(self) -> int | torch.Tensor:
        """The tokens seen: an int, or (while compiling) the count tensor, as `StaticLayer` gives it."""
        return self.cumulative_length if torch.compiler.is_compiling() else int(self.cumulative_length)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:  # no keys or values of its own to move
        self._map_states(lambda state: state.index_select(0, beam_idx.to(state.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_states(lambda state: state.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_states(lambda state: state[indices])

    def reset(self) -> None:
        for name in self.state_names:
            setattr(self, name, None)
        self.cumulative_length.zero_()
        self.is_initialized = False
