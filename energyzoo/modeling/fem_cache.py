"""What the decoding caches of FEM-LM layers share: the per-sequence states kept in step with beam search and batch
edits, the fixed-size state layer of the recurrent priors, and the lookup of a layer's own cache layer. Each prior's
cache layer is in its ``fem_prior_<name>.py``; `DynamicCache(config=...)` builds them from `config.layer_types`
(each class registers its `_layer_type`)."""

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class FEMStateMixin:
    """Per-sequence states a FEM cache layer keeps besides keys/values (tensors or tuples of tensors, or
    None), kept in step with beam search and batch edits."""

    state_names: tuple[str, ...] = ()

    def _map_states(self, fn) -> None:
        for name in self.state_names:
            state = getattr(self, name)
            if isinstance(state, tuple):
                setattr(self, name, tuple(fn(tensor) for tensor in state))
            elif state is not None:
                setattr(self, name, fn(state))

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._map_states(lambda state: state.index_select(0, beam_idx.to(state.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._map_states(lambda state: state.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._map_states(lambda state: state[indices])

    def reset(self) -> None:
        super().reset()
        for name in self.state_names:
            setattr(self, name, None)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("FEM caches cannot be cropped: their recurrent states cannot be rewound.")


class _StateOnlyLayer(CacheLayerMixin):
    """A cache layer without keys or values: the batch and beam hooks have nothing of their own to move."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        pass

    def batch_repeat_interleave(self, repeats: int) -> None:
        pass

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        pass

    def reset(self) -> None:  # nothing of its own to zero; the states are dropped by `FEMStateMixin.reset`
        self.is_initialized = False


class FEMRecurrentCacheLayer(FEMStateMixin, _StateOnlyLayer):
    """Fixed-size decoding state of one FEM layer with a recurrent prior (FEM App. H.2-H.4): the prior's
    state (for GLA the decayed sums of k~ [v, exp(beta v - M), 1] and their shift M), the conditioner's
    state and the number of tokens seen. Its size does not grow with the sequence.

    What transformers' cache utilities see: ``keys`` / ``values`` stay None (``update`` refuses keys and values),
    ``get_seq_length`` / ``get_mask_sizes`` count the tokens seen, ``is_initialized`` turns True with the first
    tokens, beam and batch edits move the states, ``reset`` empties them, and ``crop`` is refused (a recurrent
    state cannot be rewound). It is not one of transformers' linear-attention layers (its states are FEM's own
    tuples), so ``Cache.has_previous_state`` and ``get_recurrent_state`` refuse it, naming its type; early
    (static) initialisation does not apply."""

    is_croppable = False
    supports_early_init = False
    state_names = ("time_decay_state", "prior_state")

    def __init__(self, **kwargs):
        super().__init__()
        self.time_decay_state: torch.Tensor | None = None
        self.prior_state: tuple[torch.Tensor, ...] | None = None
        self.seen_tokens = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise NotImplementedError("recurrent FEM layers hold a state, not keys and values")

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("recurrent FEM layers hold a state, not keys and values; FEMAttention updates it")

    def advance(self, prior_state: tuple[torch.Tensor, ...], new_tokens: int) -> None:
        self.prior_state = prior_state
        self.seen_tokens += new_tokens
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.seen_tokens

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen_tokens + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0


def own_cache_layer(past_key_values: Cache | None, layer_idx: int, expected: type) -> CacheLayerMixin | None:
    """Layer ``layer_idx``'s FEM cache layer (of class ``expected``) in ``past_key_values``. An empty layer of another
    class takes this code's place: transformers builds `DynamicCache(config=...)` from one process-wide table of layer
    types, which holds the classes of the copy of this code loaded last (another exported folder's, or the installed
    package's), and a plain `DynamicCache()` holds none yet. A filled one of another class is refused."""
    if past_key_values is None:
        return None
    layers = past_key_values.layers
    layer = layers[layer_idx] if layer_idx < len(layers) else None
    if isinstance(layer, expected):
        return layer
    if layer is not None and layer.is_initialized or layer_idx > len(layers):
        found = "none" if layer is None else f"a filled {type(layer).__module__}.{type(layer).__qualname__}"
        raise TypeError(
            f"FEM layer {layer_idx} needs an empty or its own {expected.__module__}.{expected.__qualname__} cache "
            f"layer (it keeps the FEM states); found {found}. Build caches with DynamicCache(config=model.config)."
        )
    layer = expected()
    if layer_idx < len(layers):
        layers[layer_idx] = layer
    else:
        layers.append(layer)
    return layer
