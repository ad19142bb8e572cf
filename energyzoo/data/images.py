"""`datasets` image-classification sources held in memory, and the image processor that gives a trained classifier's
pixels to `pipeline("image-classification")`."""

import numpy as np
import torch

from .hub import load_hub_dataset


def hub_image_split(data, seed: int):
    """A `datasets` image-classification source (``name``, ``subset``, ``split``; local files through ``paths``,
    e.g. name "imagefolder"): images from ``image_column`` as RGB in [-1, 1], resized to ``image_size`` when given,
    labels from ``label_column``, split by ``validation_fraction`` with ``seed``. Held in memory (CIFAR-size sets)."""
    parts = load_hub_dataset(data).train_test_split(test_size=data.validation_fraction, seed=seed)

    def tensors(dataset):
        images = torch.stack([torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32)).permute(2, 0, 1)
                              for image in dataset[data.image_column]]) / 127.5 - 1.0
        if data.image_size is not None:
            images = torch.nn.functional.interpolate(images, size=data.image_size, mode="bilinear", antialias=True)
        return images, torch.tensor(dataset[data.label_column], dtype=torch.long)

    return (*tensors(parts["train"]), *tensors(parts["test"]))



def image_processor_for(data, config):
    """The image processor that turns 8-bit images into the pixel values a classifier trained on ``data`` (a recipe's
    `DataSection`, or None for a model trained elsewhere) saw: ``num_channels`` channels scaled to [-1, 1]
    (x / 127.5 - 1, the scaling of `hub_image_split`; the digits' 0..16 are x / 8 - 1, i.e. the same for 8-bit images
    with 16 -> 255),
    resized to the training size (PIL's bilinear; `hub_image_split` resizes tensors with torch's antialiased bilinear,
    close but not bit-equal). What `pipeline("image-classification")` and the Hub widget use; a single-channel model's
    turns its (RGB) images to grayscale first."""
    from transformers import ViTImageProcessorPil

    from ..modeling.image_processing_grayscale import GrayscaleImageProcessor

    size = 8 if data is not None and data.source == "digits" else getattr(data, "image_size", None)
    size = size or getattr(config, "image_size", None)
    channels = config.num_channels
    processor = GrayscaleImageProcessor if channels == 1 else ViTImageProcessorPil
    return processor(do_resize=size is not None, size={"height": size, "width": size} if size else None,
                     do_rescale=True, rescale_factor=1 / 255, do_normalize=True, image_mean=[0.5] * channels,
                     image_std=[0.5] * channels, do_convert_rgb=channels == 3)
