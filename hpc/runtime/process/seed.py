"""Seeding, and the random state a checkpoint keeps per rank.

The state is saved as tensors, numbers and strings only, so that a checkpoint's RNG file loads with
``weights_only=True``: numpy's state goes as its parts, not as the pickled ndarray numpy.random.get_state()
returns. Files of earlier hpc versions hold that ndarray; they load with numpy's three array globals allowed
(OLD_NUMPY_GLOBALS), nothing more.
"""

from __future__ import annotations

import random


def seed_every_generator(seed: int) -> None:
    """Seed python, numpy (when installed) and torch (CPU and every GPU) alike on every rank."""
    import torch

    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def rng_state() -> dict:
    """This process's random state: python's, numpy's (when installed), torch's CPU and GPU generators."""
    import torch

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, gauss = numpy.random.get_state()
        state["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                          "has_gauss": int(has_gauss), "gauss": float(gauss)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    import torch

    random.setstate(_python_state(state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(_numpy_state(state["numpy"]))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _python_state(saved) -> tuple:
    # random.setstate wants tuples; a state that went through a list-only format comes back as lists
    version, internal, gauss = saved
    return int(version), tuple(int(x) for x in internal), gauss


def _numpy_state(saved):
    if not isinstance(saved, dict):  # an earlier hpc's file: numpy's own tuple, ndarray included
        return saved
    import numpy

    keys = numpy.asarray(saved["keys"].numpy() if hasattr(saved["keys"], "numpy") else saved["keys"],
                         dtype=numpy.uint32)
    return saved["kind"], keys, saved["pos"], saved["has_gauss"], saved["gauss"]


def old_numpy_globals() -> list:
    """What an earlier hpc's RNG file needs beyond weights_only's defaults: numpy's ndarray rebuilt from its
    bytes (what Accelerate allows, no more). Empty without numpy."""
    try:
        import numpy
    except ImportError:
        return []
    core = getattr(numpy, "_core", None) or numpy.core
    reconstruct = core.multiarray._reconstruct
    # files written under numpy 1 name it numpy.core.multiarray; under numpy 2, numpy._core.multiarray
    names = {"numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct"}
    allowed = [numpy.ndarray, numpy.dtype, *[(reconstruct, name) for name in sorted(names)]]
    dtypes = getattr(numpy, "dtypes", None)  # numpy >= 1.25 pickles the dtype's class too
    return allowed + ([dtypes.UInt32DType] if dtypes is not None else [])
