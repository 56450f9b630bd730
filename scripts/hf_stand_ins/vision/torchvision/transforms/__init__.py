"""The torchvision.transforms the transformers and diffusers example scripts use, written on PIL and torch."""

import enum
import random

import numpy as np
import torch
from PIL import Image


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


_PIL = {InterpolationMode.NEAREST: Image.NEAREST, InterpolationMode.BILINEAR: Image.BILINEAR,
        InterpolationMode.BICUBIC: Image.BICUBIC}


def _pair(size):
    return (size, size) if isinstance(size, int) else tuple(size)


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image):
        for transform in self.transforms:
            image = transform(image)
        return image


class Lambda:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, image):
        return self.fn(image)


class Resize:
    def __init__(self, size, interpolation=InterpolationMode.BILINEAR, **kwargs):
        self.size, self.interpolation = size, _PIL.get(interpolation, Image.BILINEAR)

    def __call__(self, image):
        if isinstance(self.size, int) or len(self.size) == 1:
            short = self.size if isinstance(self.size, int) else self.size[0]
            width, height = image.size
            scale = short / min(width, height)
            return image.resize((max(1, round(width * scale)), max(1, round(height * scale))), self.interpolation)
        height, width = self.size
        return image.resize((width, height), self.interpolation)


def _crop(image, top, left, height, width):
    return image.crop((left, top, left + width, top + height))


class CenterCrop:
    def __init__(self, size):
        self.size = _pair(size)

    def __call__(self, image):
        height, width = self.size
        return _crop(image, (image.size[1] - height) // 2, (image.size[0] - width) // 2, height, width)


class RandomCrop(CenterCrop):
    def __call__(self, image):
        height, width = self.size
        return _crop(image, random.randint(0, max(0, image.size[1] - height)),
                     random.randint(0, max(0, image.size[0] - width)), height, width)


class RandomResizedCrop:
    def __init__(self, size, scale=(0.5, 1.0), **kwargs):
        self.size, self.scale = _pair(size), scale

    def __call__(self, image):
        width, height = image.size
        side = random.uniform(*self.scale) ** 0.5
        crop_w, crop_h = max(1, int(width * side)), max(1, int(height * side))
        image = _crop(image, random.randint(0, height - crop_h), random.randint(0, width - crop_w), crop_h, crop_w)
        return image.resize((self.size[1], self.size[0]), Image.BILINEAR)


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, image):
        if random.random() >= self.p:
            return image
        if isinstance(image, torch.Tensor):
            return image.flip(-1)
        return image.transpose(Image.FLIP_LEFT_RIGHT)


class PILToTensor:
    def __call__(self, image):
        array = np.array(image)
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.copy()).permute(2, 0, 1).contiguous()


class ToTensor:
    def __call__(self, image):
        return PILToTensor()(image).float() / 255.0


class ConvertImageDtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, tensor):
        if tensor.dtype == torch.uint8 and self.dtype.is_floating_point:
            return tensor.to(self.dtype) / 255.0
        return tensor.to(self.dtype)


class Normalize:
    def __init__(self, mean, std, inplace=False):
        self.mean, self.std = mean, std

    def __call__(self, tensor):
        mean = torch.as_tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.as_tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return (tensor - mean) / std
