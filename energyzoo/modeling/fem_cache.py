"""Decoding caches of FEM-LM layers, built by `DynamicCache(config=...)` from `config.layer_types`
(each class registers its `_layer_type`): keys and augmented values for the softmax prior, fixed-size
recurrent states for the GLA and AFT priors, and the time-decay conditioner's state for every layer."""

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

from .configuration_fem import fem_layer_type


class _FEMStateMixin:
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


class FEMSoftmaxCacheLayer(_FEMStateMixin, DynamicLayer):
    """Decoding state of one FEM layer with the softmax prior: the prior's keys, the augmented values
    [v, exp(beta v - M)] of the one-pass read (FEM App. F.4) as ``keys`` / ``values``, the shift M, and the
    time-decay conditioner's O(H_c) state (App. I, Prop. I.1).

    `softmax_free_energy_read` takes ``prior_state`` and returns the next one (it rescales the cached exp
    values when M moves, online-softmax style), which ``advance`` stores; so cached decoding computes the
    read of one full forward while each step only exponentiates its own values. With the default budget
    (i), [v, exp(beta v)] has the Q/K head width: the value cache has the size of Llama's (fp16 models cache
    in fp32, since fp16 cannot hold the exp branch)."""

    _layer_type = fem_layer_type("softmax")
    is_croppable = False
    state_names = ("time_decay_state", "exp_shift")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.time_decay_state: torch.Tensor | None = None
        self.exp_shift: torch.Tensor | None = None

    @property
    def prior_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """``(keys, augmented values, shift)`` of the cached positions, None before the first tokens."""
        return (self.keys, self.values, self.exp_shift) if self.is_initialized else None

    def advance(self, prior_state: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None], new_tokens: int) -> None:
        keys, values, self.exp_shift = prior_state
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("FEM softmax layers cache augmented values; FEMAttention advances them")


class _StateOnlyLayer(CacheLayerMixin):
    """A cache layer without keys or values: the batch and beam hooks have nothing of their own to move."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        pass

    def batch_repeat_interleave(self, repeats: int) -> None:
        pass

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        pass

    def reset(self) -> None:  # nothing of its own to zero; the states are dropped by `_FEMStateMixin.reset`
        self.is_initialized = False


class FEMRecurrentCacheLayer(_FEMStateMixin, _StateOnlyLayer):
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


class FEMGLACacheLayer(FEMRecurrentCacheLayer):
    _layer_type = fem_layer_type("gla")


class FEMAFTCacheLayer(FEMRecurrentCacheLayer):
    _layer_type = fem_layer_type("aft")


class FEMSSMCacheLayer(FEMRecurrentCacheLayer):
    _layer_type = fem_layer_type("ssm")
