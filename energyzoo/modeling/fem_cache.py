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
    [v, exp(beta v - M)] of the one-pass read (FEM App. F.4), the shift M, and the time-decay conditioner's
    O(H_c) state (App. I, Prop. I.1).

    The shift follows the maximum of beta v per channel (with headroom, see `exp_branch`). When it moves,
    the cached exp values are rescaled by exp(M_old - M_new) (online-softmax style), so cached decoding
    computes the same read as one full forward while each step only exponentiates its own values. With the
    default budget (i), [v, exp(beta v)] has the Q/K head width: the value cache has the size of Llama's."""

    _layer_type = fem_layer_type("softmax")
    is_croppable = False
    state_names = ("time_decay_state", "exp_shift")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.time_decay_state: torch.Tensor | None = None
        self.exp_shift: torch.Tensor | None = None

    def update(self, key_states, value_states, *args, exp_shift: torch.Tensor | None = None, **kwargs):
        """Append keys and augmented values; ``exp_shift`` is the shift the new exp values were taken at,
        and the cached exp values are brought to it first when it moved."""
        if exp_shift is not None:
            moved = self.exp_shift is not None and self.get_seq_length() > 0 and not torch.equal(exp_shift, self.exp_shift)
            if moved:
                half = self.values.shape[-1] // 2
                rescale = torch.exp(self.exp_shift - exp_shift).to(self.values.dtype)
                self.values = torch.cat([self.values[..., :half], self.values[..., half:] * rescale], dim=-1)
            self.exp_shift = exp_shift
        return super().update(key_states, value_states, *args, **kwargs)


class _StateOnlyLayer(CacheLayerMixin):
    """A cache layer without keys or values: the batch and beam hooks have nothing of their own to move."""

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        pass

    def batch_repeat_interleave(self, repeats: int) -> None:
        pass

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        pass


class FEMRecurrentCacheLayer(_FEMStateMixin, _StateOnlyLayer):
    """Fixed-size decoding state of one FEM layer with a recurrent prior (FEM App. H.2-H.4): the prior's
    state (for GLA the decayed sums of k~ [v, exp(beta v - M), 1] and their shift M), the conditioner's
    state and the number of tokens seen. Its size does not grow with the sequence."""

    is_croppable = False
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
