"""The one config check of the zoo: a `ValueError` that names the field, the value and what is allowed.

Every config and settings class (model configs, `TELSettings`, the run recipes) checks its values with
`require`, once per construction: under huggingface_hub's ``@strict``, every method named ``validate_*``
becomes a class validator that runs after ``__init__``, so a config has exactly one such method and helpers
it calls are named otherwise.
"""


def require(owner: str, condition: bool, field: str, allowed: str, value) -> None:
    """Raise ``ValueError("<owner>.<field> must be <allowed>, got <value>")`` unless ``condition`` holds."""
    if not condition:
        raise ValueError(f"{owner}.{field} must be {allowed}, got {value!r}")
