"""Accelerate's big-model inference: empty models, device maps, hooks, offload to CPU and disk, checkpoint loading."""
