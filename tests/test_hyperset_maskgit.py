"""MaskGIT with Hyper-SET (hyperset.txt §5.3, D.4): iterative decoding, the k-means patch tokenizer and the
reconstruction metrics."""

import math

import numpy as np
import pytest
import torch
from skimage.metrics import peak_signal_noise_ratio
from sklearn.datasets import load_digits

from energyzoo import model_from_preset
from energyzoo.data.image_tokenizer import PatchKMeansTokenizer, load_image_tokenizer, reconstruction_metrics

MASK = 17


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return model_from_preset("hyperset-mim-tiny").eval()


def test_decoding_reveals_cells_on_the_arccos_schedule_and_keeps_the_given_ones(model):
    ids = torch.randint(0, MASK, (3, 64), generator=torch.Generator().manual_seed(1))
    ids[0] = MASK  # fully masked
    ids[1, ::3] = MASK  # partly masked
    masked_per_call = []
    handle = model.register_forward_pre_hook(lambda module, args, kwargs: masked_per_call.append(
        (kwargs["input_ids"] == MASK).sum(-1).tolist()), with_kwargs=True)
    steps = 6
    out = model.generate_codes(ids, steps=steps, generator=torch.Generator().manual_seed(2))
    handle.remove()
    assert (out != MASK).all() and torch.equal(out[ids != MASK], ids[ids != MASK])
    weights = [math.acos(1 - k / (steps - 1)) for k in range(steps)]  # arccos(r), r = 1 .. 0
    for sample, initially in ((0, 64), (1, 22), (2, 0)):
        known = [initially - counts[sample] for counts in masked_per_call]
        expected = [round(sum(weights[:k]) / sum(weights) * initially) for k in range(steps)]
        assert known == expected, (sample, known, expected)


def test_one_round_at_low_temperature_is_the_argmax_of_the_logits(model):
    ids = torch.randint(0, MASK, (2, 64), generator=torch.Generator().manual_seed(3))
    ids[:, 10:40] = MASK
    with torch.no_grad():
        argmax = model(input_ids=ids).logits.argmax(-1)
    out = model.generate_codes(ids, steps=1, temperature=1e-4)
    torch.testing.assert_close(out[:, 10:40], argmax[:, 10:40])
    with pytest.raises(ValueError, match="temperature > 0"):
        model.generate_codes(ids, temperature=0.0)


def test_kmeans_tokenizer_round_trips_the_digits_and_reloads(tmp_path):
    images = load_digits().images
    tokenizer = PatchKMeansTokenizer(patch_size=2, codebook_size=64).fit(images[:1000])
    codes = tokenizer.encode(images[1000:1100])
    assert codes.shape == (100, 16) and 0 <= codes.min() and codes.max() < 64
    reconstructed = tokenizer.decode(codes, (8, 8))
    metrics = reconstruction_metrics(images[1000:1100], reconstructed)
    shuffled = reconstruction_metrics(images[1000:1100], reconstructed[::-1])
    assert metrics["psnr"] > shuffled["psnr"] + 5 and metrics["ssim"] > shuffled["ssim"] + 0.3
    tokenizer.save(tmp_path)
    assert torch.equal(PatchKMeansTokenizer.load(tmp_path).encode(images[1000:1100]), codes)


def test_reconstruction_metrics_match_scikit_image_on_normalised_images():
    rng = np.random.default_rng(0)
    reference = rng.uniform(2.0, 6.0, (3, 8, 8))
    noisy = reference + rng.normal(0.0, 0.2, reference.shape)
    expected = np.mean([peak_signal_noise_ratio((r - r.min()) / np.ptp(r), np.clip((n - r.min()) / np.ptp(r), 0, 1),
                                                data_range=1.0) for r, n in zip(reference, noisy)])
    assert reconstruction_metrics(reference, noisy)["psnr"] == pytest.approx(expected)
    assert reconstruction_metrics(reference, reference)["ssim"] == pytest.approx(1.0)


def test_a_diffusers_vq_model_loads_by_name_and_round_trips_like_its_own_forward(tmp_path):
    from diffusers import VQModel

    torch.manual_seed(0)
    VQModel(in_channels=1, out_channels=1, down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1, latent_channels=4,
            num_vq_embeddings=32, vq_embed_dim=4, norm_num_groups=4, sample_size=8).save_pretrained(tmp_path / "vq")
    tokenizer = load_image_tokenizer(tmp_path / "vq")
    images = torch.randn(3, 1, 8, 8)
    codes = tokenizer.encode(images)
    with torch.no_grad():
        latents = tokenizer.model.encode(images).latents.permute(0, 2, 3, 1).reshape(-1, 4)
        nearest = torch.cdist(latents, tokenizer.model.quantize.embedding.weight).argmin(-1)
        expected = tokenizer.model(images).sample  # VQModel.forward: encode, quantise, decode
    assert codes.shape == (3, 16) and torch.equal(codes.reshape(-1), nearest)
    torch.testing.assert_close(tokenizer.decode(codes), expected)
    PatchKMeansTokenizer(2, 8).fit(load_digits().images[:100]).save(tmp_path / "kmeans")
    assert isinstance(load_image_tokenizer(tmp_path / "kmeans"), PatchKMeansTokenizer)
