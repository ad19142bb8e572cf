"""The image processor of the zoo's single-channel classifiers (trained on 8x8 digits): ViT's preprocessing of
images turned to 8-bit grayscale first. `pipeline("image-classification")` and the Hub widget hand a processor RGB
images, which transformers' own processors keep as three channels."""

from PIL import Image
from transformers import ViTImageProcessorPil


class GrayscaleImageProcessor(ViTImageProcessorPil):
    """`ViTImageProcessorPil` on images converted to PIL's 8-bit grayscale ("L": ITU-R 601-2 luma) first."""

    def preprocess(self, images, *args, **kwargs):
        single = not isinstance(images, (list, tuple))
        gray = [(image if isinstance(image, Image.Image) else Image.fromarray(image)).convert("L")
                for image in ([images] if single else images)]
        return super().preprocess(gray, *args, **kwargs)
