"""Shared check for the recurrent priors: prefill, chunked prefill and token-by-token reads agree."""

import torch


def assert_streaming_agrees(read, length: int, time_dim: int, **kwargs) -> None:
    """``read(start, stop, state)`` returns ``(mu, f_max, state)`` for positions [start, stop); the
    concatenated pieces of uneven chunks and of single tokens must equal one read of everything."""
    full_mu, full_f, _ = read(0, length, None)
    for bounds in (((0, 13), (13, 14), (14, 31), (31, length)), tuple((t, t + 1) for t in range(length))):
        state, mus, f_maxes = None, [], []
        for start, stop in bounds:
            mu, f_max, state = read(start, stop, state)
            mus.append(mu)
            f_maxes.append(f_max)
        torch.testing.assert_close(torch.cat(mus, time_dim), full_mu, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.cat(f_maxes, time_dim), full_f, rtol=1e-4, atol=1e-4)
