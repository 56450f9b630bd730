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
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["LOGGER_TYPE_TO_CLASS", "AimTracker", "ClearMLTracker", "CometMLTracker", "DVCLiveTracker",
           "GeneralTracker", "JsonlTracker", "MLflowTracker", "SwanLabTracker", "TensorBoardTracker", "TrackioTracker",
           "WandBTracker", "filter_trackers", "get_available_trackers", "logger", "on_main_process",
           "register_tracker_class"]

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.state": ["PartialState"],
    "hpc.logging": ["get_logger"],
    "hpc.utils": ["LoggerType", "compare_versions", "is_aim_available", "is_clearml_available",
                 "is_comet_ml_available", "is_dvclive_available", "is_mlflow_available", "is_swanlab_available",
                 "is_tensorboard_available", "is_trackio_available", "is_wandb_available", "listify",
                 "str_to_bool"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
