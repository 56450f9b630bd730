"""Stands in for torchvision (its only wheel for this torch is a CUDA build): the transforms the example scripts
import, on PIL images and tensors."""

__version__ = "0.0.0+stand-in"
