"""`datasets` image-classification sources held in memory (a Hub id, or a folder of one sub-folder per class through
``datasets``' imagefolder), what they say of the model (classes, image size, channels: `ImageSplit.config_fields`),
and the image processor that gives a trained classifier's pixels to `pipeline("image-classification")`."""

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..modeling.errors import UserError
from .hub import load_hub_dataset

GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")  # PIL's one-channel modes (LA: with transparency)


@dataclass
class ImageSplit:
    """(train images, labels, validation images, labels) and the facts of the data the model must match."""

    tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    class_names: list[str] | None  # a `ClassLabel`'s names (an image folder's sub-folders), None for bare integers
    image_size: int
    num_channels: int

    def config_fields(self) -> dict:
        """The config fields these images fix: the classes (``id2label`` / ``label2id``, which set ``num_labels``),
        the image size and the channels."""
        fields = {"image_size": self.image_size, "num_channels": self.num_channels}
        if self.class_names is not None:
            fields.update(id2label=dict(enumerate(self.class_names)),
                          label2id={name: index for index, name in enumerate(self.class_names)})
        return fields


def _source_name(data) -> str:
    return f"the image folder {', '.join(data.paths)}" if data.name == "imagefolder" else f"data.name={data.name!r}"


def _checked_columns(dataset, data) -> list[str] | None:
    """The class names of the label column (None for integer labels), after checking both columns exist and there
    are two classes at least."""
    columns = dataset.column_names
    if data.image_column not in columns:
        raise UserError(f"data.image_column={data.image_column!r} is not a column of {_source_name(data)} (columns: "
                        f"{', '.join(columns)}): set data.image_column to the one holding the images")
    if data.label_column not in columns:
        if data.name == "imagefolder" and data.label_column == "label":  # no label column of one class folder
            rows = dataset.cast_column(data.image_column, _undecoded())[data.image_column]
            classes = sorted({Path(row["path"]).parent.name for row in rows})
            raise UserError(f"{_source_name(data)} has one class ({', '.join(classes)}): a classifier needs two, one "
                            "sub-folder of images per class (folder/cats/*.png, folder/dogs/*.png)")
        raise UserError(f"data.label_column={data.label_column!r} is not a column of {_source_name(data)} (columns: "
                        f"{', '.join(columns)}): set data.label_column to the one holding the classes")
    names = getattr(dataset.features[data.label_column], "names", None)
    if names is not None and len(names) < 2:
        raise UserError(f"{_source_name(data)} has one class ({', '.join(names)}): a classifier needs two")
    return names


def _undecoded():
    from datasets import Image

    return Image(decode=False)


def _pil_images(dataset, column: str) -> list:
    """The images of ``column`` opened one by one, so that a file PIL cannot read is named (`datasets` would decode
    them without saying which)."""
    from PIL import Image, UnidentifiedImageError

    images = []
    for row in dataset.cast_column(column, _undecoded())[column]:
        where = row.get("path") or "an image of the dataset"
        try:
            image = Image.open(io.BytesIO(row["bytes"]) if row.get("bytes") else row["path"])
            image.load()
        except (UnidentifiedImageError, OSError, SyntaxError) as error:
            raise UserError(f"{where}: not an image that can be read ({str(error).splitlines()[0]}); remove it or "
                            "replace it") from None
        images.append(image)
    return images


def _image_size(images: list, data) -> int:
    """``data.image_size``, else the images' own size where they all share one square size."""
    if data.image_size is not None:
        return data.image_size
    sizes = sorted({image.size for image in images})
    if len(sizes) == 1 and sizes[0][0] == sizes[0][1]:
        return sizes[0][0]
    shown = " and ".join(f"{width}x{height}" for width, height in sizes[:2])
    raise UserError(f"the images of {_source_name(data)} are of {len(sizes)} sizes ({shown}{', ...' * (len(sizes) > 2)}"
                    f"): set data.image_size=N to train on them resized to N x N")


def hub_image_split(data, seed: int) -> ImageSplit:
    """A `datasets` image-classification source (``name``, ``subset``, ``split``; local files through ``paths``:
    name "imagefolder" with a folder of class sub-folders): images from ``image_column`` scaled to [-1, 1], labels
    from ``label_column``, split by ``validation_fraction`` with ``seed``. ``data.num_channels`` 1 or 3 reads them as
    grayscale or RGB (None: grayscale when every image is), ``data.image_size`` resizes them (None: their own size,
    which must be one square size). Held in memory (CIFAR-size sets)."""
    dataset = load_hub_dataset(data)
    class_names = _checked_columns(dataset, data)
    parts = dataset.train_test_split(test_size=data.validation_fraction, seed=seed)
    images = {name: _pil_images(part, data.image_column) for name, part in parts.items()}
    every = images["train"] + images["test"]
    channels = data.num_channels or (1 if all(image.mode in GRAYSCALE_MODES for image in every) else 3)
    size = _image_size(every, data)

    def tensors(name):
        mode = "L" if channels == 1 else "RGB"
        pixels = [np.asarray(image.convert(mode), dtype=np.float32) for image in images[name]]
        batch = [torch.from_numpy(array).reshape(*array.shape[:2], channels).permute(2, 0, 1) for array in pixels]
        resized = [picture if picture.shape[-2:] == (size, size) else torch.nn.functional.interpolate(
            picture[None], size=size, mode="bilinear", antialias=True)[0] for picture in batch]
        return torch.stack(resized) / 127.5 - 1.0, torch.tensor(parts[name][data.label_column], dtype=torch.long)

    return ImageSplit((*tensors("train"), *tensors("test")), class_names, size, channels)



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
