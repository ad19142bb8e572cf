"""A small image tokenizer for masked image modelling at CPU scale, and reconstruction metrics.

MaskGIT (hyperset.txt §5.3) models the codes of a frozen VQ tokenizer; the paper's is a VQGAN on 256 px images. This
one vector-quantises non-overlapping patches with scikit-learn's k-means, so it trains offline in seconds on the
embedded 8x8 digits: ``PatchKMeansTokenizer(patch_size=2, codebook_size=64).fit(images)`` maps an 8x8 digit to a
4x4 grid of 64 codes and back. A pretrained VQ model from a maintained library replaces it by name:
`load_image_tokenizer` reads a folder this module saved, or a diffusers `VQModel` (a VQGAN) by Hub id or folder,
through the same ``encode`` / ``decode`` pair.
"""

import json
import math
from pathlib import Path

import numpy as np
import torch

from ..modeling.errors import UserError, needs_extra
from .digits import masking_split, shuffled_digit_images

DIGIT_PATCH_CODES = 64  # codebook of the digits' 2x2 patches: an 8x8 digit becomes a 4x4 grid of 64 codes


class PatchKMeansTokenizer:
    """Codes of non-overlapping ``patch_size`` x ``patch_size`` patches: the nearest of ``codebook_size`` k-means
    centres (scikit-learn), in row-major patch order. Images are (N, H, W) or (N, 1, H, W) arrays."""

    def __init__(self, patch_size: int = 2, codebook_size: int = 64, seed: int = 0):
        self.patch_size, self.codebook_size, self.seed = patch_size, codebook_size, seed
        self._centres: np.ndarray | None = None

    def _patches(self, images) -> tuple[np.ndarray, tuple[int, int]]:
        images = np.asarray(images, dtype=np.float64)
        images = images.reshape(len(images), *images.shape[-2:])
        count, height, width = images.shape
        size = self.patch_size
        if height % size or width % size:
            raise UserError(f"image side {height}x{width} is not a multiple of patch_size {size}")
        grid = (height // size, width // size)
        patches = images.reshape(count, grid[0], size, grid[1], size).transpose(0, 1, 3, 2, 4)
        return patches.reshape(-1, size * size), grid

    def fit(self, images) -> "PatchKMeansTokenizer":
        patches, _ = self._patches(images)
        with needs_extra("vision"):
            from sklearn.cluster import KMeans
        self._centres = KMeans(self.codebook_size, n_init=1, random_state=self.seed).fit(patches).cluster_centers_
        return self

    @property
    def centres(self) -> np.ndarray:
        if self._centres is None:
            raise UserError("PatchKMeansTokenizer is not fitted: call fit(images) or load(folder) first")
        return self._centres

    def encode(self, images) -> torch.Tensor:
        """(N, cells) codes in [0, codebook_size)."""
        patches, grid = self._patches(images)
        distances = ((patches[:, None, :] - self.centres[None]) ** 2).sum(-1)
        return torch.from_numpy(distances.argmin(-1)).long().view(-1, grid[0] * grid[1])

    def decode(self, codes, image_size: tuple[int, int]) -> np.ndarray:
        """(N, H, W) images whose patches are the codes' centres."""
        codes = np.asarray(codes)
        size, (height, width) = self.patch_size, image_size
        patches = self.centres[codes].reshape(len(codes), height // size, width // size, size, size)
        return patches.transpose(0, 1, 3, 2, 4).reshape(len(codes), height, width)

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        settings = dict(patch_size=self.patch_size, codebook_size=self.codebook_size, seed=self.seed)
        (folder / "image_tokenizer.json").write_text(json.dumps({**settings, "centres": self.centres.tolist()}))

    @classmethod
    def load(cls, folder: str | Path) -> "PatchKMeansTokenizer":
        stored = json.loads((Path(folder) / "image_tokenizer.json").read_text())
        tokenizer = cls(stored["patch_size"], stored["codebook_size"], stored["seed"])
        tokenizer._centres = np.asarray(stored["centres"])
        return tokenizer


class DiffusersVQTokenizer:
    """A diffusers `VQModel` as an image tokenizer: ``encode`` gives the indices of its quantised latent grid,
    row-major, (N, h * w); ``decode`` maps indices back through the codebook and the decoder, (N, C, H, W)."""

    def __init__(self, model):
        self.model = model.eval()

    @torch.no_grad()
    def encode(self, images: torch.Tensor) -> torch.Tensor:
        latents = self.model.encode(images).latents
        _, _, (_, _, indices) = self.model.quantize(latents)
        return indices.reshape(len(images), -1)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, image_size=None) -> torch.Tensor:
        """``image_size`` is the decoder's to decide (accepted for the tokenizers' common signature)."""
        count, cells = codes.shape
        side = math.isqrt(cells)
        width = self.model.quantize.vq_embed_dim
        latents = self.model.quantize.get_codebook_entry(codes.reshape(-1), (count, side, side, width))
        return self.model.decode(latents, force_not_quantize=True).sample


def load_image_tokenizer(name: str | Path, subfolder: str | None = None):
    """A folder written by `PatchKMeansTokenizer.save`, or a diffusers `VQModel` by Hub id or folder (``subfolder``
    where the repository keeps it, e.g. "vqvae")."""
    if (Path(name) / "image_tokenizer.json").exists():
        return PatchKMeansTokenizer.load(name)
    try:
        from diffusers import VQModel
    except ImportError as error:
        raise ImportError(f"{name!r} is not a PatchKMeansTokenizer folder; loading a VQ model by name needs "
                          "diffusers (pip install 'energyzoo[vq]')") from error
    return DiffusersVQTokenizer(VQModel.from_pretrained(name, subfolder=subfolder))


def reconstruction_metrics(reference, reconstructed) -> dict[str, float]:
    """Mean PSNR and SSIM (scikit-image) over images, each pair min-max normalised to [0, 1] by the reference's
    range first (the paper normalises images before scoring, D.4)."""
    with needs_extra("vision"):
        from skimage.metrics import peak_signal_noise_ratio, structural_similarity
    psnr, ssim = [], []
    for target, image in zip(np.asarray(reference, dtype=np.float64), np.asarray(reconstructed, dtype=np.float64)):
        low, span = target.min(), max(target.max() - target.min(), 1e-12)
        target, image = (target - low) / span, np.clip((image - low) / span, 0.0, 1.0)
        psnr.append(peak_signal_noise_ratio(target, image, data_range=1.0))
        side = min(target.shape)
        window = min(7, side if side % 2 else side - 1)  # skimage needs an odd window inside the image
        ssim.append(structural_similarity(target, image, data_range=1.0, win_size=window))
    return {"psnr": float(np.mean(psnr)), "ssim": float(np.mean(ssim))}


def digit_patch_tokenizer(validation_fraction: float, seed: int) -> PatchKMeansTokenizer:
    """The k-means tokenizer of the digits' 2x2 patches, fitted on the training split of ``seed``'s order."""
    images = shuffled_digit_images(seed)
    cut = int(len(images) * (1 - validation_fraction))
    return PatchKMeansTokenizer(patch_size=2, codebook_size=DIGIT_PATCH_CODES, seed=seed).fit(images[:cut])


def digit_patch_split(validation_fraction: float, seed: int, schedule: str):
    """The digits as 4x4 grids of k-means patch codes (`digit_patch_tokenizer`), split by `masking_split` with mask
    id ``DIGIT_PATCH_CODES``."""
    codes = digit_patch_tokenizer(validation_fraction, seed).encode(shuffled_digit_images(seed))
    return masking_split(codes, validation_fraction, schedule, DIGIT_PATCH_CODES, seed)
