"""Stands in for albumentations (which needs OpenCV): the transforms run_semantic_segmentation_no_trainer.py
uses, on numpy images (H, W, C) and masks (H, W)."""

import random

import numpy as np
from PIL import Image


class BasicTransform:
    def __init__(self, p=1.0):
        self.p = p

    def apply(self, image, mask):
        return image, mask


class Compose:
    def __init__(self, transforms, **kwargs):
        self.transforms = transforms

    def __call__(self, image, mask=None, **kwargs):
        for transform in self.transforms:
            if random.random() < transform.p:
                image, mask = transform.apply(image, mask)
        return {"image": image, "mask": mask}


class Lambda(BasicTransform):
    def __init__(self, name=None, image=None, mask=None, p=1.0, **kwargs):
        super().__init__(p)
        self.image_fn, self.mask_fn = image, mask

    def apply(self, image, mask):
        return (self.image_fn(image) if self.image_fn else image), (self.mask_fn(mask) if self.mask_fn else mask)


class PadIfNeeded(BasicTransform):
    def __init__(self, min_height, min_width, border_mode=0, value=0, fill=None, fill_mask=None, p=1.0, **kwargs):
        super().__init__(p)
        self.min_height, self.min_width = min_height, min_width
        self.fill = value if fill is None else fill
        self.fill_mask = value if fill_mask is None else fill_mask

    def apply(self, image, mask):
        pad_h, pad_w = max(0, self.min_height - image.shape[0]), max(0, self.min_width - image.shape[1])
        if pad_h or pad_w:
            pads = ((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2))
            image = np.pad(image, pads + ((0, 0),) * (image.ndim - 2), constant_values=self.fill)
            mask = np.pad(mask, pads, constant_values=self.fill_mask)
        return image, mask


class RandomCrop(BasicTransform):
    def __init__(self, height, width, p=1.0, **kwargs):
        super().__init__(p)
        self.height, self.width = height, width

    def apply(self, image, mask):
        top = random.randint(0, image.shape[0] - self.height)
        left = random.randint(0, image.shape[1] - self.width)
        window = (slice(top, top + self.height), slice(left, left + self.width))
        return image[window], mask[window]


class HorizontalFlip(BasicTransform):
    def apply(self, image, mask):
        return image[:, ::-1].copy(), mask[:, ::-1].copy()


class Resize(BasicTransform):
    def __init__(self, height, width, p=1.0, **kwargs):
        super().__init__(p)
        self.size = (width, height)

    def apply(self, image, mask):
        return (np.array(Image.fromarray(image).resize(self.size, Image.BILINEAR)),
                np.array(Image.fromarray(mask).resize(self.size, Image.NEAREST)))


class Normalize(BasicTransform):
    def __init__(self, mean, std, max_pixel_value=255.0, p=1.0, **kwargs):
        super().__init__(p)
        self.mean = np.asarray(mean, dtype=np.float32) * max_pixel_value
        self.std = np.asarray(std, dtype=np.float32) * max_pixel_value

    def apply(self, image, mask):
        return (image.astype(np.float32) - self.mean) / self.std, mask
