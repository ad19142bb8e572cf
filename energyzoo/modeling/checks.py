"""The one config check of the zoo: a `ValueError` that names the field, the value and what is allowed.

Every config and settings class (model configs, `TELSettings`, the run recipes) checks its values with
`require`, once per construction: under huggingface_hub's ``@strict``, every method named ``validate_*``
becomes a class validator that runs after ``__init__``, so a config has exactly one such method and helpers
it calls are named otherwise.

Every configuration file imports this one, so an exported folder's code starts here: it refuses, in one line, a
transformers older than the one it is written for (v5 configs are dataclasses; the cache and attention interfaces
it uses are v5's).
"""

import transformers
from packaging.version import Version

MINIMUM_TRANSFORMERS = "5.23"  # keep in step with pyproject.toml

if Version(transformers.__version__) < Version(MINIMUM_TRANSFORMERS):
    raise ImportError(f"this model's code needs transformers>={MINIMUM_TRANSFORMERS}, found {transformers.__version__}: "
                      f"pip install -U 'transformers>={MINIMUM_TRANSFORMERS}'")


def require(owner: str, condition: bool, field: str, allowed: str, value) -> None:
    """Raise ``ValueError("<owner>.<field> must be <allowed>, got <value>")`` unless ``condition`` holds."""
    if not condition:
        raise ValueError(f"{owner}.{field} must be {allowed}, got {value!r}")
