"""The optional parts of energyzoo (pyproject's extras): what loading, generating, fine-tuning and training need is
the base install; lm-eval (``eval``), the image metrics and the digits data (``vision``), plotting (``plots``) and
the statistics of the reproduction verdicts (``reproduce``) come with their extra, and a missing one is named in one
line when it is first used."""

from collections.abc import Iterator
from contextlib import contextmanager

from .modeling.errors import MissingExtra


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Imports inside this block come with energyzoo's ``extra``: a missing one raises `MissingExtra` naming it."""
    try:
        yield
    except ModuleNotFoundError as error:
        package = (error.name or "a package").split(".")[0]
        raise MissingExtra(f"{package} is not installed: it comes with energyzoo's [{extra}] extra "
                          f"(pip install 'energyzoo[{extra}]')") from error
