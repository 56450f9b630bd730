"""albumentations.pytorch.ToTensorV2: (H, W, C) image to a (C, H, W) tensor, mask to a tensor."""

import numpy as np
import torch

from albumentations import BasicTransform


class ToTensorV2(BasicTransform):
    def __init__(self, p=1.0, **kwargs):
        super().__init__(p)

    def apply(self, image, mask):
        image = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
        return image, torch.from_numpy(np.ascontiguousarray(mask))
