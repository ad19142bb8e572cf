"""The caches `generate()` may build for a zoo LM: transformers' dynamic and static caches of the model's own cache
layers (registered by layer type, so `DynamicCache(config=...)` and `StaticCache(config=...)` build them). Offloaded
and quantized caches move or quantise keys and values only, and would leave the zoo layers' other states behind, so
they are refused before anything runs."""

from transformers.masking_utils import create_causal_mask

from .errors import UserError
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
