from __future__ import annotations

import random


def set_seed(seed: int) -> None:
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
