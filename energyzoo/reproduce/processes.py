"""Independent runs of an experiment in worker processes."""

from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context

import torch


@contextmanager
def runs_mapped(workers: int) -> Iterator[Callable]:
    """``map``, or with ``workers`` > 1 a pool's ``map`` over that many spawned processes of one thread each: tiny
    models use one core about as well as two, so two processes on two cores nearly halve the wall time."""
    if workers <= 1:
        yield map
        return
    with ProcessPoolExecutor(workers, get_context("spawn"), initializer=torch.set_num_threads,
                             initargs=(1,)) as pool:
        yield pool.map
