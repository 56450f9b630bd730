"""What transformers.image_utils imports from torchvision.transforms.functional when torchvision is on the path."""

from . import PILToTensor


def pil_to_tensor(image):
    return PILToTensor()(image)
