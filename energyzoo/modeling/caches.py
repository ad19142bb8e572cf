"""The zoo's decoding caches. Which caches `generate()` may build for a zoo LM: transformers' dynamic and static
caches of the model's own cache layers (registered by layer type, so `DynamicCache(config=...)` and
`StaticCache(config=...)` build them); offloaded and quantized caches move or quantise keys and values only, and would
leave the zoo layers' other states behind, so they are refused before anything runs (`CacheKindsMixin`). What the
zoo's own cache layers share (FEM's, EqT-LLaMA's): per-sequence states besides keys and values, kept in step with beam
search and batch edits and, in static layers, at fixed addresses (`CacheStatesMixin`); and the lookup of a layer's own
cache layer in a cache that transformers or a user built (`own_cache_layer`)."""

import torch
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import create_causal_mask

from .errors import UserError, UserTypeError
from .transformers_compat import takes_cache, with_cache

CACHE_IMPLEMENTATIONS = (None, "dynamic", "static")


class CacheKindsMixin:
    """Refuses, up front, a ``cache_implementation`` outside `CACHE_IMPLEMENTATIONS`, for the reason the model gives
    in ``other_caches_refused``."""

    other_caches_refused: str

    def _prepare_cache_for_generation(self, generation_config, *args, **kwargs):
        kind = generation_config.cache_implementation
        if kind not in CACHE_IMPLEMENTATIONS:
            raise UserError(
                f"{type(self).__name__} supports cache_implementation=None, 'dynamic' or 'static', got {kind!r}: "
                f"{self.other_caches_refused}."
            )
        return super()._prepare_cache_for_generation(generation_config, *args, **kwargs)

    def _decodes_with_causal_mask(self) -> bool:
        """Whether the layers read a causal mask over the cache (False: the recurrences read only padding flags)."""
        return True

    @takes_cache
    def create_masks_for_generate(self, config, inputs_embeds, attention_mask, cache, position_ids,
                                  is_first_iteration: bool = False, **kwargs):
        """The mask `generate()` passes with a compileable cache. The prompt gets its 2-D mask, from which the model
        reads the padding flags, positions and masks it needs (transformers' default would pass only a 4-D mask,
        losing the flags). A decoding step gets a mask whose shape does not change from step to step, so compiled
        decoding never recompiles: the 4-D causal mask over the whole static cache (also when `generate` dropped an
        all-ones mask: a padded and an unpadded batch then make the same call), or none for layers that read no
        causal mask (they read only the new tokens' padding flags, and a step's tokens are generated, so real)."""
        if is_first_iteration or (attention_mask is not None and attention_mask.dim() != 2):
            return attention_mask
        if not self._decodes_with_causal_mask():
            return None
        return create_causal_mask(config=config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                  position_ids=position_ids, **with_cache(cache))


class CacheStatesMixin:
    """Per-sequence states a zoo cache layer keeps besides keys/values (tensors or tuples of tensors, or
    None), kept in step with beam search and batch edits. A layer that ``keeps_in_place`` (static and recurrent
    ones) copies a new state into the tensors it holds, so their addresses stay fixed for compiled, graph-captured
    decoding; the others rebind."""

    state_names: tuple[str, ...] = ()
    keeps_in_place = False
    is_croppable = False

    def keep(self, name: str, state: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
        held = getattr(self, name)
        if not self.keeps_in_place or held is None:
            setattr(self, name, state)
        elif isinstance(state, tuple):
            for tensor, new in zip(held, state):
                tensor.copy_(new)
        else:
            held.copy_(state)

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
        raise NotImplementedError(f"{type(self).__name__} cannot be cropped: its states cannot be rewound to an "
                                  "earlier length.")



def own_cache_layer(cache: Cache | None, layer_idx: int, cache_layers: tuple[type, type], owner: str
                    ) -> CacheLayerMixin | None:
    """Layer ``layer_idx``'s own cache layer (one of the (dynamic, static) ``cache_layers`` of ``owner``) in
    ``cache``. An empty layer of another class takes this code's place (the static class where it was a
    static layer, of its length): transformers builds `DynamicCache(config=...)` / `StaticCache(config=...)` from
    process-wide tables of layer types, which hold the classes of the copy of this code loaded last (another exported
    folder's, or the installed package's), and a plain `DynamicCache()` holds none yet. A filled one of another class
    is refused."""
    if cache is None:
        return None
    layers = cache.layers
    layer = layers[layer_idx] if layer_idx < len(layers) else None
    if isinstance(layer, cache_layers):
        return layer
    expected = cache_layers[0]
    if layer is not None and layer.is_initialized or layer_idx > len(layers):
        found = "none" if layer is None else f"a filled {type(layer).__module__}.{type(layer).__qualname__}"
        raise UserTypeError(
            f"{owner} layer {layer_idx} needs an empty or its own {expected.__module__}.{expected.__qualname__} "
            f"cache layer (it keeps {owner}'s states); found {found}. Build caches with "
            "DynamicCache(config=model.config) or StaticCache(config=model.config, max_cache_len=...)."
        )
    max_cache_len = getattr(layer, "max_cache_len", None)
    layer = expected() if max_cache_len is None else cache_layers[1](max_cache_len=max_cache_len)
    if layer_idx < len(layers):
        layers[layer_idx] = layer
    else:
        layers.append(layer)
    return layer
