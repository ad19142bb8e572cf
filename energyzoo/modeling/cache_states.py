"""What the zoo's own decoding cache layers share (FEM's, EqT-LLaMA's): per-sequence states besides keys and values,
kept in step with beam search and batch edits and, in static layers, at fixed addresses; and the lookup of a layer's
own cache layer in a cache that transformers or a user built."""

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .errors import UserTypeError


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
