"""`accelerate.tracking` as hpc spells it: the tracker base class and the built-in trackers."""

from hpc.runtime.tracking import (GeneralTracker, JsonlTracker, MLflowTracker, TensorBoardTracker,  # noqa: F401
                                  WandBTracker)

__all__ = ["GeneralTracker", "JsonlTracker", "MLflowTracker", "TensorBoardTracker", "WandBTracker"]
