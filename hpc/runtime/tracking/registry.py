"""Accelerate's tracker registry: LOGGER_TYPE_TO_CLASS (the name -> class table log_with is read with),
register_tracker_class, filter_trackers, get_available_trackers, and on_main_process for tracker methods.

The table is trackers.TRACKERS itself, so a class registered here is what `log_with="<its name>"` starts.
"""

from __future__ import annotations

import enum
import functools
import warnings

from hpc.errors import HpcError
from hpc.runtime.tracking import trackers
from hpc.runtime.tracking.optional_trackers import SwanLabTracker, TrackioTracker
from hpc.runtime.tracking.rank_logging import get_logger
from hpc.runtime.tracking.trackers import GeneralTracker

trackers.TRACKERS.setdefault("trackio", TrackioTracker)
trackers.TRACKERS.setdefault("swanlab", SwanLabTracker)
LOGGER_TYPE_TO_CLASS: dict[str, type] = trackers.TRACKERS
logger = get_logger(__name__)


class LoggerType(str, enum.Enum):
    """Accelerate's tracker names (hpc adds "jsonl", which it always writes)."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]


def _name(item) -> str:
    return str(getattr(item, "value", item)).lower()


def resolve(log_with: list) -> list:
    """trackers.resolve, with the optional trackers registered."""
    return trackers.resolve(log_with)


def get_available_trackers() -> list[LoggerType]:
    """The built-in trackers whose library is installed here."""
    return [member for member in LoggerType
            if member.value in LOGGER_TYPE_TO_CLASS and trackers.installed(member.value)]


def register_tracker_class(tracker_class: type) -> None:
    """Makes ``log_with="<tracker_class.name>"`` start ``tracker_class`` (built as hpc builds its trackers:
    ``(logging_dir, project_name, config, **init_kwargs[name])``). Register before init_trackers."""
    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"`tracker_class` must be a subclass of `GeneralTracker`, but got {tracker_class}.")
    if not getattr(tracker_class, "name", None):
        raise ValueError("The tracker class to register must define a non-empty `name` attribute.")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError("The tracker class to register must define a `requires_logging_directory` class attribute.")
    if tracker_class.name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"A tracker with the name '{tracker_class.name}' is already registered and will be "
                      f"overwritten by {tracker_class}.", stacklevel=2)
    LOGGER_TYPE_TO_CLASS[tracker_class.name] = tracker_class


def filter_trackers(log_with, logging_dir=None) -> list:
    """``log_with`` as Accelerate reads it: tracker instances kept, names of installed trackers (each once, as
    LoggerType or the registered name), "all" for every installed one; an unknown name, or a tracker that needs a
    logging directory without one, is refused."""
    if log_with is None:
        return []
    if not isinstance(log_with, (list, tuple)):
        log_with = [log_with]
    if any(_name(item) == "all" for item in log_with if not isinstance(item, GeneralTracker)):
        return [item for item in log_with if isinstance(item, GeneralTracker)] + get_available_trackers()
    chosen: list = []
    for item in log_with:
        if isinstance(item, GeneralTracker):
            chosen.append(item)
            continue
        name = _name(item)
        if name not in LOGGER_TYPE_TO_CLASS:
            raise HpcError(f"log_with={name!r} is not a tracker hpc knows",
                           fix=f"use one of {', '.join(LOGGER_TYPE_TO_CLASS)}, or register_tracker_class(...)")
        entry = LoggerType(name) if name in LoggerType.list() else name
        if entry in chosen or not trackers.installed(name):
            continue
        if getattr(LOGGER_TYPE_TO_CLASS[name], "requires_logging_directory", False) and logging_dir is None:
            raise HpcError(f"logging with {name!r} needs a logging directory", fix="pass project_dir or logging_dir")
        chosen.append(entry)
    return chosen


def on_main_process(function):
    """A tracker method that runs on the main process only when its tracker's ``main_process_only`` is set
    (read at each call, so decorating starts no process state)."""

    @functools.wraps(function)
    def run(self, *args, **kwargs):
        if getattr(self, "main_process_only", False):
            from hpc.runtime.process.state import PartialState

            return PartialState().on_main_process(function)(self, *args, **kwargs)
        return function(self, *args, **kwargs)

    return run
