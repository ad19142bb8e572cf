"""The transformers releases this code was tested on, and the one API difference between them.

transformers 5.24 renamed the cache argument: a model's ``forward(..., cache=...)``, the ``cache`` field of the output
classes, ``create_causal_mask(..., cache=...)`` and ``generate()``'s ``model_inputs["cache"]``; 5.23 calls all of them
``past_key_values``. A forward that takes the other release's name would receive the cache in ``**kwargs`` and decode
every step from one token without context, so the zoo's forwards take 5.24's name through `takes_cache`, which maps
5.23's name onto it (silently on 5.23, where it is the release's own name; with transformers' own FutureWarning on
5.24) and refuses a cache passed under any name the forward does not read. Outputs are built and read through
`CACHE_FIELD`, the installed release's field name.

This file travels with every exported folder, so the range below is the range that folder's code was tested on:
importing it under another release refuses in one line, instead of decoding wrong tokens. Setting
``ENERGYZOO_ALLOW_UNTESTED_TRANSFORMERS=1`` lets it load anyway (the upstream canary, `scripts/check_upstream.sh`).
"""

import functools
import inspect
import os

import transformers
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

from .errors import UntestedTransformers, UserError, UserTypeError

TESTED_TRANSFORMERS = ">=5.23,<5.25"  # keep in step with pyproject.toml
UNTESTED_OVERRIDE = "ENERGYZOO_ALLOW_UNTESTED_TRANSFORMERS"
# The names transformers has given a model's cache; a cache under one the forward does not read is refused.
CACHE_NAMES = ("cache", "past_key_values", "cache_params")


def check_transformers_release(version: str = transformers.__version__) -> None:
    """Refuse, in one line naming the tested range, a transformers release outside `TESTED_TRANSFORMERS`."""
    if Version(version) not in SpecifierSet(TESTED_TRANSFORMERS) and os.environ.get(UNTESTED_OVERRIDE) != "1":
        raise UntestedTransformers(
            f"energyzoo's model code was tested on transformers {TESTED_TRANSFORMERS}, but {version} is installed: "
            f'install one of those (pip install "transformers{TESTED_TRANSFORMERS}"), or set {UNTESTED_OVERRIDE}=1 '
            "to run it untested."
        )


# "cache" from transformers 5.24 on, "past_key_values" before
CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


def with_cache(cache: Cache | None) -> dict:
    """The keyword an output class or transformers' mask functions take a cache by, on the installed release."""
    return {CACHE_FIELD: cache}


def cache_of(outputs) -> Cache | None:
    """The cache a model output carries (`CACHE_FIELD`), read without the deprecated alias."""
    return getattr(outputs, CACHE_FIELD)


def _refuses_unread_caches(forward):
    """``forward``, refusing a cache passed under a name it does not read (one transformers used elsewhere, or any
    keyword holding a `Cache`), which ``**kwargs`` would otherwise swallow."""
    read = {name for name, parameter in inspect.signature(forward).parameters.items()
            if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}

    @functools.wraps(forward)
    def checked(*args, **kwargs):
        for name, value in kwargs.items():
            if name not in read and (name in CACHE_NAMES and value is not None or isinstance(value, Cache)):
                raise UserTypeError(f"{forward.__qualname__} got a cache as `{name}`, which it does not read: pass "
                                    "it as `cache` (transformers >= 5.24) or `past_key_values`.")
        return forward(*args, **kwargs)

    return checked


def _renamed(forward, old: str, new: str):
    """``forward``, taking its ``new`` argument also as ``old``, without a warning."""

    @functools.wraps(forward)
    def renamed(*args, **kwargs):
        if old in kwargs:
            if kwargs.get(new) is not None:
                raise UserError(f"{forward.__qualname__}: pass the cache once, as `{new}` or `{old}`.")
            kwargs[new] = kwargs.pop(old)
        return forward(*args, **kwargs)

    return renamed


def takes_cache(forward):
    """Decorates a forward whose cache parameter is ``cache`` (or, wrapping a transformers forward of 5.23,
    ``past_key_values``): callers may pass either name, ``past_key_values`` with the FutureWarning transformers' own
    models give on 5.24, and a cache under a name the forward does not read is refused."""
    checked = _refuses_unread_caches(forward)
    reads = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
    if reads == "cache" and CACHE_FIELD == "cache":
        return deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")(checked)
    return _renamed(checked, "past_key_values" if reads == "cache" else "cache", reads)
