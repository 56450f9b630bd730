"""`accelerate.tracking` as hpc spells it: the tracker base class, the built-in trackers (Trackio and SwanLab need
their packages) and the registry, defined in hpc.runtime.tracking."""

from hpc.runtime.tracking.optional_trackers import SwanLabTracker, TrackioTracker
from hpc.runtime.tracking.registry import (
    LOGGER_TYPE_TO_CLASS,
    filter_trackers,
    get_available_trackers,
    logger,
    on_main_process,
    register_tracker_class,
)
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

__all__ = ["LOGGER_TYPE_TO_CLASS", "AimTracker", "ClearMLTracker", "CometMLTracker", "DVCLiveTracker",
           "GeneralTracker", "JsonlTracker", "MLflowTracker", "SwanLabTracker", "TensorBoardTracker", "TrackioTracker",
           "WandBTracker", "filter_trackers", "get_available_trackers", "logger", "on_main_process",
           "register_tracker_class"]
