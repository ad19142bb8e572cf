"""The zoo's own exception classes: what the user got wrong, told apart from what energyzoo got wrong.

Every check of a config field, a recipe key, a file or a model input raises a `UserError` (a `ValueError`, as
transformers' own checks raise, so ``except ValueError`` keeps working) whose one-line message names the field, file
or input and what is allowed. The `energyzoo` command answers these in one line with exit code 2; any other exception
is a bug in energyzoo and is shown with its traceback (exit code 1).
"""

import difflib
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(ValueError):
    """A bad value, type, file or input, named in the message."""


def require(owner: str, condition: bool, field: str, allowed: str, value) -> None:
    """Raise ``UserError("<owner>.<field> must be <allowed>, got <value>")`` unless ``condition`` holds."""
    if not condition:
        raise UserError(f"{owner}.{field} must be {allowed}, got {value!r}")


class UserTypeError(UserError, TypeError):
    """A value of the wrong type (a config field's annotation, a keyword the forward does not read): a `TypeError`
    too, as Python and huggingface_hub's ``@strict`` raise for a wrong type."""


class MissingExtra(ImportError):
    """An optional dependency of the feature asked for is not installed (the message names energyzoo's extra that
    brings it)."""


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Imports inside this block come with energyzoo's ``extra`` (pyproject's extras): what loading, generating,
    fine-tuning and training need is the base install; lm-eval (``eval``), the image metrics and the digits data
    (``vision``), plotting (``plots``) and the statistics of the reproduction verdicts (``reproduce``) come with
    theirs, and a missing one raises `MissingExtra` naming it, in one line, when it is first used."""
    try:
        yield
    except ModuleNotFoundError as error:
        package = (error.name or "a package").split(".")[0]
        raise MissingExtra(f"{package} is not installed: it comes with energyzoo's [{extra}] extra "
                           f"(pip install 'energyzoo[{extra}]')") from error


class UntestedTransformers(ImportError):
    """The installed transformers release is outside the range this code was tested on (an `ImportError`, raised
    when the model code is imported)."""


def did_you_mean(value: str, names) -> str:
    """``"; did you mean '<name>'?"`` for the name of ``names`` closest to ``value`` (difflib's ratio), or "" when
    none is close: a hint for a typo, instead of a line of every name."""
    close = difflib.get_close_matches(str(value), [str(name) for name in names], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""
