"""The in-job half (the first place torch is imported): Accelerator and friends.

The names load on first use, so that the few torch-free modules in here (the checkpoint manifest, read by the
batch script to find a self-resuming script's newest good checkpoint) can be imported without torch.
"""

_NAMES = {"Accelerator": "hpc.runtime.accelerator", "DistributedDataParallelKwargs": "hpc.runtime.handlers",
          "GradScalerKwargs": "hpc.runtime.handlers", "set_seed": "hpc.runtime.process.random_states"}

__all__ = list(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        import importlib

        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'hpc.runtime' has no attribute {name!r}")
