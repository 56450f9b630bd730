"""Metrics, logged by the main process: JSONL always; TensorBoard, Weights & Biases and MLflow when installed and
asked for (`log_with`); any `GeneralTracker` subclass of the user's, as Accelerate takes them.

A requeued or resumed job goes on with the same run: TensorBoard purges the steps the interrupted attempt logged
after the checkpoint, the JSONL file gets a `resumed_at` line (rows after it replace earlier rows of a later step),
and W&B and MLflow continue the run whose id the first attempt kept next to the logs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Any

from hpc.errors import HpcError


class GeneralTracker:
    """Accelerate's tracker contract: ``name``, ``requires_logging_directory``, a ``tracker`` property (the
    library's own run object), ``start``, ``store_init_configuration``, ``log`` and ``finish``. Subclass it for a
    tracker of your own and pass an instance in ``log_with``."""

    main_process_only = True
    requires_logging_directory = False

    def __init__(self, _blank: bool = False):
        if not _blank and not isinstance(getattr(type(self), "name", None), str):
            raise HpcError(f"{type(self).__name__} has no `name`", fix="give the tracker class a name = '...'")

    @property
    def tracker(self):
        return None

    def start(self) -> None:
        pass

    def store_init_configuration(self, values: dict) -> None:
        pass

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        pass

    def finish(self) -> None:
        pass

    # hpc's own: a resumed job continues the run from the checkpoint's step
    def resumed_at(self, step: int) -> None:
        pass


def _number(value):
    item = getattr(value, "item", None)
    return item() if callable(item) else value


class JsonlTracker(GeneralTracker):
    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        folder.mkdir(parents=True, exist_ok=True)
        self.file = open(folder / f"{run_name}.jsonl", "a", buffering=1)
        if config:
            self.store_init_configuration(config)

    @property
    def tracker(self):
        return self.file

    def store_init_configuration(self, values: dict) -> None:
        self.file.write(json.dumps({"config": values, "time": time.time()}, default=str) + "\n")

    def resumed_at(self, step: int) -> None:
        self.file.write(json.dumps({"resumed_at": step, "time": time.time()}) + "\n")

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.file.write(json.dumps({"step": step, "time": time.time(), **values}, default=_number) + "\n")

    def finish(self) -> None:
        self.file.close()


class TensorBoardTracker(GeneralTracker):
    name = "tensorboard"
    requires_logging_directory = True
    package = "tensorboard"

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        from torch.utils.tensorboard import SummaryWriter

        self.folder, self.kwargs = str(folder / run_name), kwargs
        self.writer = SummaryWriter(self.folder, **kwargs)
        if config:
            self.store_init_configuration(config)

    @property
    def tracker(self):
        return self.writer

    def store_init_configuration(self, values: dict) -> None:
        self.writer.add_text("config", json.dumps(values, default=str, indent=2))

    def resumed_at(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()  # the same folder again; what the last attempt logged after `step` is dropped
        self.writer = SummaryWriter(self.folder, purge_step=step + 1, **self.kwargs)

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        for key, value in values.items():
            value = _number(value)
            if isinstance(value, str):
                self.writer.add_text(key, value, step)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, {k: _number(v) for k, v in value.items()}, step)
            else:
                self.writer.add_scalar(key, value, step)

    def finish(self) -> None:
        self.writer.close()


def _kept_id(folder: Path, run_name: str, tracker: str) -> tuple[Path, str | None]:
    """The run id an earlier attempt of this job kept, so a requeued job logs into the same run."""
    path = folder / f"{run_name}.{tracker}-run-id"
    return path, (path.read_text().strip() if path.exists() else None)


class WandBTracker(GeneralTracker):
    name = "wandb"
    package = "wandb"

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        import wandb

        folder.mkdir(parents=True, exist_ok=True)
        path, run_id = _kept_id(folder, run_name, self.name)
        settings = {"project": run_name, "dir": str(folder), "config": config, **kwargs}
        settings.setdefault("id", run_id)
        settings.setdefault("resume", "allow")
        self.run = wandb.init(**settings)
        path.write_text(self.run.id + "\n")

    @property
    def tracker(self):
        return self.run

    def store_init_configuration(self, values: dict) -> None:
        self.run.config.update(values, allow_val_change=True)

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.run.log({k: _number(v) for k, v in values.items()}, step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


class MLflowTracker(GeneralTracker):
    """Runs in the MLflow server (or database) of MLFLOW_TRACKING_URI, else in a file store next to the logs
    (``mlruns``): MLflow keeps the file store in maintenance, but it needs neither a server nor SQLAlchemy."""

    name = "mlflow"
    package = "mlflow"

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        import mlflow

        folder.mkdir(parents=True, exist_ok=True)
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri((folder / "mlruns").absolute().as_uri())
        path, run_id = _kept_id(folder, run_name, self.name)
        experiment = mlflow.get_experiment_by_name(run_name)
        experiment_id = experiment.experiment_id if experiment else mlflow.create_experiment(run_name)
        self.run = mlflow.start_run(run_id=kwargs.pop("run_id", None) or run_id, experiment_id=experiment_id, **kwargs)
        path.write_text(self.run.info.run_id + "\n")
        self.mlflow = mlflow
        if config and not run_id:  # parameters cannot change once logged: a resumed run keeps its own
            self.store_init_configuration(config)

    @property
    def tracker(self):
        return self.run

    def store_init_configuration(self, values: dict) -> None:
        self.mlflow.log_params({k: str(v)[:6000] for k, v in values.items()})

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        numbers = {k: float(_number(v)) for k, v in values.items() if isinstance(_number(v), (int, float))}
        self.mlflow.log_metrics(numbers, step=step)

    def finish(self) -> None:
        self.mlflow.end_run()


TRACKERS: dict[str, type] = {"jsonl": JsonlTracker, "tensorboard": TensorBoardTracker, "wandb": WandBTracker,
                             "mlflow": MLflowTracker}
# Accelerate's other names: refused by name until hpc wires them (a GeneralTracker subclass works meanwhile)
NOT_WIRED = ("comet_ml", "aim", "clearml", "dvclive", "trackio", "swanlab")


def installed(name: str) -> bool:
    package = getattr(TRACKERS.get(name), "package", None)
    return package is None or importlib.util.find_spec(package) is not None


def resolve(log_with: list) -> list:
    """`log_with` -> tracker classes (by name) and the user's GeneralTracker instances, JSONL first, each once.
    "all" is every built-in tracker whose library is installed."""
    chosen: list[Any] = [JsonlTracker]
    for item in log_with:
        if isinstance(item, GeneralTracker):
            chosen.append(item)
            continue
        name = str(getattr(item, "value", item)).lower()
        if name == "all":
            chosen += [cls for n, cls in TRACKERS.items() if installed(n)]
        elif name in NOT_WIRED:
            raise HpcError(f"log_with={name!r} is not wired up in hpc yet",
                           fix=f"use {', '.join(TRACKERS)}, or pass a GeneralTracker subclass of your own")
        elif name not in TRACKERS:
            raise HpcError(f"log_with={name!r} is not a tracker hpc knows", fix=f"use one of {', '.join(TRACKERS)}")
        elif not installed(name):
            raise HpcError(f"log_with={name!r}: the {TRACKERS[name].package} package is not installed",
                           fix=f"pip install {TRACKERS[name].package}")
        else:
            chosen.append(TRACKERS[name])
    unique: list[Any] = []
    for item in chosen:
        if item not in unique:
            unique.append(item)
    return unique
