"""Finished parts of a long experiment kept on disk, so that a run killed at a session's end resumes where it stopped.

`Parts` keeps each part's result in ``<output_dir>/parts/<key>.pt`` with the settings and code that made it (the
experiment's `code_state`); a later run of the same settings on the same code (`stale_code`) reads it back instead of
computing it again, and anything else is computed afresh. It also adds up the wall time of every run that
contributed, which the report gives as its ``seconds``.
"""

import json
import time
from functools import partial
from pathlib import Path

import torch

from ..files import write_file_whole


class Parts:
    def __init__(self, experiment: str, settings: dict, output_dir: str | Path):
        from .report import code_state  # the report module imports the experiments table, which imports this

        self.experiment = experiment
        self.settings = json.loads(json.dumps(settings))
        self.folder = Path(output_dir) / "parts"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.code = code_state(experiment)
        self.started = time.perf_counter()
        self.clock = self.folder / "seconds.json"
        self.earlier_seconds = self._earlier_seconds()

    def _earlier_seconds(self) -> float:
        """The wall time of the earlier runs whose parts this one reads back (none where nothing is reusable)."""
        if not self.clock.is_file():
            return 0.0
        recorded = json.loads(self.clock.read_text())
        return recorded["seconds"] if recorded["settings"] == self.settings else 0.0

    def read(self, key: str):
        """The part's result if a run of these settings on this code finished it, else None."""
        from .report import stale_code

        path = self.folder / f"{key}.pt"
        if not path.is_file():
            return None
        saved = torch.load(path, weights_only=False)
        if saved["settings"] != self.settings or stale_code(self.experiment, {"code": saved["code"]}) is not None:
            return None
        return saved["result"]

    def write(self, key: str, result) -> None:
        """Keep a finished part (written whole: a run killed while writing leaves no half part) and the wall time."""
        write_file_whole(self.folder / f"{key}.pt",
                         partial(torch.save, {"settings": self.settings, "code": self.code, "result": result}))
        self.clock.write_text(json.dumps({"settings": self.settings, "seconds": self.seconds()}))

    def seconds(self) -> float:
        """The wall time of this run and of the earlier ones it continues."""
        return self.earlier_seconds + time.perf_counter() - self.started
