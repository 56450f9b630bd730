"""`accelerate.tracking` as hpc spells it: the tracker base class and the built-in trackers."""

from hpc.runtime.tracking.trackers import (
    AimTracker,
    ClearMLTracker,
    CometMLTracker,
    DVCLiveTracker,
    GeneralTracker,
    JsonlTracker,
    MLflowTracker,
    TensorBoardTracker,
    WandBTracker,
)

__all__ = ["AimTracker", "ClearMLTracker", "CometMLTracker", "DVCLiveTracker", "GeneralTracker", "JsonlTracker",
           "MLflowTracker", "TensorBoardTracker", "WandBTracker"]
