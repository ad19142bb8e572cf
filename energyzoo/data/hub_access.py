"""Every place energyzoo reaches the Hugging Face Hub (a tokenizer, a warm start, a `datasets` source, lm-eval's
tasks) goes through `reaching_hub`: offline, or with a name the Hub does not have, the user gets one line naming the
setting and what to do, at once, instead of a library's traceback after its retries (52 s for `tokenizer.name=gpt2` on
a machine without a network)."""

import socket
from contextlib import contextmanager
from functools import cache
from unittest import mock
from urllib.parse import urlparse

from ..modeling.errors import UserError

REACH_TIMEOUT_SECONDS = 3.0
# `datasets`' builders of local files (data.name=json with data.paths, ...): names that reach no Hub
PACKAGED_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "imagefolder", "audiofolder", "webdataset", "pandas"}


@cache
def hub_reachable() -> bool:
    """Whether the Hub can be reached: offline mode is not set (``HF_HUB_OFFLINE``) and its endpoint
    (``HF_ENDPOINT``) takes a connection within `REACH_TIMEOUT_SECONDS`; asked once a process."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    endpoint = urlparse(constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=REACH_TIMEOUT_SECONDS).close()
    except OSError:
        return False
    return True


def _connection_failure(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a failed connection to the Hub."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    while error is not None:
        if isinstance(error, (ConnectionError, TimeoutError, LocalEntryNotFoundError, OfflineModeIsEnabled)):
            return True
        if "couldn't connect" in str(error) or type(error).__name__ in ("ConnectError", "ConnectTimeout"):
            return True
        error = error.__cause__ or error.__context__
    return False


@contextmanager
def reaching_hub(what: str, instead: str, missing: tuple[type, ...] = (OSError,)):
    """Run the block that reads ``what`` (the setting that names it: ``tokenizer.name='gpt2'``) from the Hub; yields
    whether to read the local cache only (the Hub unreachable: then `datasets` is told it is offline, as
    ``HF_HUB_OFFLINE`` would have at its import, so that it reads its cache instead of retrying). An error raised
    then, or a failed connection at any time, becomes one `UserError` saying to connect, to use a cached copy or
    ``instead`` (a local alternative); an error of a type in ``missing`` (the library's "no such repository")
    becomes one line naming it."""
    import datasets

    offline = not hub_reachable()
    try:
        with mock.patch.object(datasets.config, "HF_HUB_OFFLINE", datasets.config.HF_HUB_OFFLINE or offline):
            yield offline
    except UserError:
        raise
    except Exception as error:  # noqa: BLE001 - sorted below: offline, unreachable, not found, or re-raised
        if offline or _connection_failure(error):
            raise UserError(f"{what} is read from the Hugging Face Hub, which cannot be reached from "
                            f"here{' (HF_HUB_OFFLINE is set)' if _offline_mode() else ''}, and no cached copy of it "
                            f"is here: connect (a first run caches it), or {instead}") from None
        if isinstance(error, missing):
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UserError(f"{what}: {first}") from None
        raise


def _offline_mode() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)
