"""scikit-learn's 8x8 digits, always there: as images for classification, and as grids of codes for masked image
modelling (MaskGIT's masking schedules)."""

import torch

from ..modeling.errors import needs_extra

DIGITS_TEST_FRACTION = 0.2  # a fifth of the digits, drawn per seed, is that seed's test set: no run of it sees them


def _digits_in_seeded_order(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's 8x8 digits as (N, 1, 8, 8) images scaled to [-1, 1] and their labels, in the order of a
    permutation seeded by ``seed``: its first ``DIGITS_TEST_FRACTION`` is the seed's test part."""
    with needs_extra("vision"):
        from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    return images[order], labels[order]


def _test_count(total: int) -> int:
    return round(total * DIGITS_TEST_FRACTION)


def digits_split(validation_fraction: float, seed: int):
    """The digits outside the seed's test part (`digits_test_set`), split in their seeded order: (train images,
    train labels, validation images, validation labels)."""
    images, labels = _digits_in_seeded_order(seed)
    tested = _test_count(len(labels))
    images, labels = images[tested:], labels[tested:]
    cut = int(len(labels) * (1 - validation_fraction))
    return images[:cut], labels[:cut], images[cut:], labels[cut:]


def digits_test_set(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out test digits of ``seed`` (a fifth of scikit-learn's 1,797, 359, drawn per seed so that a score
    over seeds carries the test set's sampling noise as well as training's), as `digits_split`'s images: what a
    model trained with that seed and picked on its validation part is scored on."""
    images, labels = _digits_in_seeded_order(seed)
    tested = _test_count(len(labels))
    return images[:tested], labels[:tested]


DIGIT_CODES = 17  # the 8x8 digits' pixels are integers 0..16: a ready-made 17-code grid of 64 tokens

DIGIT_MASK_ID = DIGIT_CODES

MASK_SCHEDULES = ("cosine", "bernoulli-0.4")



def shuffled_digit_images(seed: int) -> torch.Tensor:
    """scikit-learn's 8x8 digits, (N, 8, 8) intensities 0..16, in a seeded order (splits cut it)."""
    with needs_extra("vision"):
        from sklearn.datasets import load_digits

    images = torch.tensor(load_digits().images, dtype=torch.float32)
    return images[torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))]



def masked_codes(codes: torch.Tensor, schedule: str, mask_id: int, generator: torch.Generator,
                 ratio_per: str = "example"):
    """(inputs, labels) for masked image modelling: masked cells hold ``mask_id`` in the inputs and their code in
    the labels (-100 elsewhere). With a ratio u ~ U(0, 1) drawn per example (``ratio_per="example"``) or once for
    all the rows (``"batch"``), ``schedule`` "cosine" masks ceil(n cos(pi u / 2)) random cells (MaskGIT's training
    schedule); "bernoulli-0.4" masks each cell with probability 0.4 u (hyperset.txt D.4: a ratio drawn in [0, 0.4],
    Bernoulli per token)."""
    count, cells = codes.shape
    u = torch.rand(count if ratio_per == "example" else 1, 1, generator=generator)
    if schedule == "cosine":
        ranks = torch.rand(count, cells, generator=generator).argsort(dim=1).argsort(dim=1)
        masked = ranks < (cells * torch.cos(torch.pi / 2 * u)).ceil()
    else:
        masked = torch.rand(count, cells, generator=generator) < 0.4 * u
    return codes.masked_fill(masked, mask_id), codes.masked_fill(~masked, -100)



def masking_split(codes: torch.Tensor, validation_fraction: float, schedule: str, mask_id: int, seed: int):
    """Codes for masked image modelling, split: the training codes unmasked, with ``remask(step, batch) -> (inputs,
    labels)``, which masks a step's global batch afresh (ratio per batch, seeded by the step: the public Hyper-SET
    code draws its masks per batch, so an image is seen under new masks every epoch), and the validation codes
    masked once per example from ``seed`` (a fixed evaluation set). Returns (train codes, validation inputs,
    validation labels, remask)."""
    cut = int(len(codes) * (1 - validation_fraction))
    validation_inputs, validation_labels = masked_codes(codes[cut:], schedule, mask_id,
                                                        torch.Generator().manual_seed(seed + 1))

    def remask(step: int, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return masked_codes(batch, schedule, mask_id, generator, ratio_per="batch")

    return codes[:cut], validation_inputs, validation_labels, remask



def digit_code_split(validation_fraction: float, seed: int, schedule: str = "cosine"):
    """scikit-learn's digits as 8x8 grids of codes 0..16 for masked image modelling (MaskGIT, hyperset.txt
    §5.3), split by `masking_split` with ``DIGIT_MASK_ID``."""
    codes = shuffled_digit_images(seed).long().reshape(-1, 64)
    return masking_split(codes, validation_fraction, schedule, DIGIT_MASK_ID, seed)
