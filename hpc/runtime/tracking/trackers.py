"""Metrics, logged by the main process: JSONL always; TensorBoard, Weights & Biases, MLflow, Comet, Aim, ClearML and
DVCLive when installed and asked for (`log_with`); any `GeneralTracker` subclass of the user's, as Accelerate takes
them. The libraries are imported when their tracker starts, never at `import hpc`.

A requeued or resumed job goes on with the same run: TensorBoard purges the steps the interrupted attempt logged
after the checkpoint, the JSONL file gets a `resumed_at` line (rows after it replace earlier rows of a later step),
and W&B, MLflow, Comet, Aim and ClearML continue the run whose id the first attempt kept in the logging folder
(`<project>.<tracker>-run-id`); DVCLive resumes its folder and drops the rows logged after the checkpoint's step.
Aim overwrites a step logged again; MLflow, Comet and ClearML keep both values of a step the interrupted attempt
logged after the checkpoint.
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


class _LibraryTracker(GeneralTracker):
    """hpc's trackers of a library's run: a name the tracker does not have is its run's (``add_images`` is the
    SummaryWriter's), as scripts written for Accelerate before 0.17, whose get_tracker returned the run itself,
    still call it (diffusers does where it cannot read Accelerate's installed version)."""

    def __getattr__(self, name):
        if name.startswith("_") or name == "tracker":
            raise AttributeError(name)
        return getattr(self.tracker, name)


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


class TensorBoardTracker(_LibraryTracker):
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


class WandBTracker(_LibraryTracker):
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


class MLflowTracker(_LibraryTracker):
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


class CometMLTracker(_LibraryTracker):
    """A Comet experiment (``comet_ml.start``, comet_ml 3.41 or later), online or offline as Comet's own settings
    say (``online=False`` in init_kwargs, or COMET_START_ONLINE=false); an offline experiment is archived into
    ``comet_ml/`` in the logging folder (unless COMET_OFFLINE_DIRECTORY or an ``experiment_config`` says otherwise), for
    ``comet upload``. A resumed job continues the experiment of the key it kept (mode ``get_or_create``); offline,
    each attempt writes its own archive with that experiment key. An attempt killed before ``end_training`` leaves
    no archive."""

    name = "comet_ml"
    package = "comet_ml"

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        import comet_ml

        if not hasattr(comet_ml, "start"):
            raise HpcError(f"comet_ml {comet_ml.__version__} has no comet_ml.start", fix="pip install 'comet_ml>=3.41'")
        folder.mkdir(parents=True, exist_ok=True)
        path, key = _kept_id(folder, run_name, self.name)
        if key and not kwargs.get("experiment_key"):
            kwargs["experiment_key"] = key
            kwargs.setdefault("mode", "get_or_create")
        if "experiment_config" not in kwargs and not os.environ.get("COMET_OFFLINE_DIRECTORY"):
            kwargs["experiment_config"] = comet_ml.ExperimentConfig(offline_directory=str(folder / "comet_ml"))
        kwargs.setdefault("project_name", run_name)
        self.experiment = comet_ml.start(**kwargs)
        path.write_text(self.experiment.get_key() + "\n")
        if config:
            self.store_init_configuration(config)

    @property
    def tracker(self):
        return self.experiment

    def store_init_configuration(self, values: dict) -> None:
        self.experiment.log_parameters(values)

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        if step is not None:
            self.experiment.set_step(step)
        for key, value in values.items():
            value = _number(value)
            if isinstance(value, (int, float)):
                self.experiment.log_metric(key, value, step=step, **kwargs)
            elif isinstance(value, str):
                self.experiment.log_other(key, value, **kwargs)
            elif isinstance(value, dict):
                self.experiment.log_metrics({k: _number(v) for k, v in value.items()}, step=step, **kwargs)

    def finish(self) -> None:
        self.experiment.end()


class AimTracker(_LibraryTracker):
    """An Aim run in the repository at the logging folder (``aim up --repo <folder>`` shows it; Aim's UI indexes new
    runs), named after the project. A resumed job reopens the run of the hash it kept; a step logged again
    replaces the value the interrupted attempt logged."""

    name = "aim"
    requires_logging_directory = True
    package = "aim"

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        from aim import Run

        folder.mkdir(parents=True, exist_ok=True)
        path, run_hash = _kept_id(folder, run_name, self.name)
        if run_hash and not kwargs.get("run_hash"):
            kwargs["run_hash"] = run_hash
        kwargs.setdefault("repo", str(folder))
        self.run = Run(**kwargs)
        self.run.name = run_name
        path.write_text(self.run.hash + "\n")
        if config:
            self.store_init_configuration(config)

    @property
    def tracker(self):
        return self.run

    def store_init_configuration(self, values: dict) -> None:
        self.run["hparams"] = values

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        """Numbers and Aim objects as Aim tracks them; text as ``aim.Text`` (Aim refuses a bare str)."""
        import aim

        for key, value in values.items():
            value = _number(value)
            self.run.track(aim.Text(value) if isinstance(value, str) else value, name=key, step=step, **kwargs)

    def log_images(self, values: dict, step: int | None = None, kwargs: dict | None = None) -> None:
        """``{name: image}`` or ``{name: (image, caption)}``, images as numpy arrays or PIL images; ``kwargs``:
        ``{"aim_image": {...}, "track": {...}}`` for ``aim.Image`` and ``Run.track``."""
        import aim

        image_kwargs, track_kwargs = (kwargs or {}).get("aim_image", {}), (kwargs or {}).get("track", {})
        for key, value in values.items():
            image, caption = value if isinstance(value, tuple) else (value, "")
            self.run.track(aim.Image(image, caption=caption, **image_kwargs), name=key, step=step, **track_kwargs)

    def finish(self) -> None:
        self.run.close()


class ClearMLTracker(_LibraryTracker):
    """A ClearML task (``Task.init``) in the project and under the task name CLEARML_PROJECT and CLEARML_TASK say,
    else the project name; a task already started in the process (``Task.current_task()``, e.g. by clearml-agent)
    is used as it is and left open. Offline (``Task.set_offline(True)`` or CLEARML_OFFLINE_MODE=1) the session is
    written under ClearML's cache folder (CLEARML_CACHE_DIR) for ``Task.import_offline_session``. A resumed job
    continues the task whose id it kept (``continue_last_task``, steps unshifted), offline too."""

    name = "clearml"
    package = "clearml"

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        from clearml import Task

        self.task, self.external = Task.current_task(), True
        if self.task is None:
            self.external = False
            folder.mkdir(parents=True, exist_ok=True)
            path, task_id = _kept_id(folder, run_name, self.name)
            if task_id and "reuse_last_task_id" not in kwargs and "continue_last_task" not in kwargs:
                kwargs.update(reuse_last_task_id=task_id, continue_last_task=0)  # 0: the steps as logged
            kwargs.setdefault("project_name", os.environ.get("CLEARML_PROJECT", run_name))
            kwargs.setdefault("task_name", os.environ.get("CLEARML_TASK", run_name))
            self.task = Task.init(**kwargs)
            path.write_text(self.task.id + "\n")
        if config:
            self.store_init_configuration(config)

    @property
    def tracker(self):
        return self.task

    def store_init_configuration(self, values: dict):
        return self.task.connect_configuration(values)

    @staticmethod
    def _title_series(name: str) -> tuple[str, str]:
        for prefix in ("eval", "test", "train"):
            if name.startswith(prefix + "_"):
                return name[len(prefix) + 1:], prefix
        return name, "train"

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        """Numbers only (others are dropped, as Accelerate does): a scalar at ``step``, a single value without
        one; ``eval_``, ``test_`` and ``train_`` prefixes name the series (``train`` otherwise)."""
        logger = self.task.get_logger()
        for key, value in values.items():
            value = _number(value)
            if not isinstance(value, (int, float)):
                continue
            if step is None:
                logger.report_single_value(name=key, value=value, **kwargs)
            else:
                title, series = self._title_series(key)
                logger.report_scalar(title=title, series=series, value=value, iteration=step, **kwargs)

    def log_images(self, values: dict, step: int | None = None, **kwargs) -> None:
        logger = self.task.get_logger()
        for key, value in values.items():
            title, series = self._title_series(key)
            logger.report_image(title=title, series=series, iteration=step, image=value, **kwargs)

    def log_table(self, table_name: str, columns: list[str] | None = None, data: list[list] | None = None,
                  dataframe: Any = None, step: int | None = None, **kwargs) -> None:
        """A table from ``columns`` and ``data`` (rows; the first is the header without ``columns``), or a
        ``dataframe``."""
        table = dataframe
        if table is None:
            if data is None:
                raise HpcError("ClearMLTracker.log_table needs data or a dataframe", fix="pass data=[[...], ...]")
            table = [columns] + data if columns else data
        title, series = self._title_series(table_name)
        self.task.get_logger().report_table(title=title, series=series, table_plot=table, iteration=step, **kwargs)

    def finish(self) -> None:
        if not self.external:
            self.task.close()


class DVCLiveTracker(_LibraryTracker):
    """DVCLive's files (``dvclive.Live``) in ``dvclive/<project>`` of the logging folder (``dir`` in init_kwargs
    elsewhere), or a ``Live`` of the user's (``init_kwargs={"dvclive": {"live": live}}``). DVCLive has no run id:
    a resumed job opens the same folder with ``resume=True`` and drops the rows the interrupted attempt logged
    after the checkpoint's step. Inside a DVC repository DVCLive also saves a DVC experiment at the end."""

    name = "dvclive"
    package = "dvclive"

    def __init__(self, folder: Path, run_name: str, config: dict | None, live: Any = None, **kwargs):
        super().__init__()
        from dvclive import Live

        folder.mkdir(parents=True, exist_ok=True)
        path, kept_dir = _kept_id(folder, run_name, self.name)
        if live is None:
            kwargs.setdefault("dir", kept_dir or str(folder / "dvclive" / run_name))
            kwargs.setdefault("resume", bool(kept_dir) and Path(kept_dir) == Path(kwargs["dir"]))
            live = Live(**kwargs)
        self.live = live
        path.write_text(str(self.live.dir) + "\n")
        if config:
            self.store_init_configuration(config)

    @property
    def tracker(self):
        return self.live

    def store_init_configuration(self, values: dict) -> None:
        self.live.log_params(values)

    def resumed_at(self, step: int) -> None:
        import csv

        for table in Path(self.live.plots_dir, "metrics").rglob("*.tsv"):
            with open(table, newline="") as f:
                rows = list(csv.DictReader(f, delimiter="\t"))
            if rows and "step" in rows[0]:
                kept = [row for row in rows if int(row["step"]) <= step]
                with open(table, "w", newline="") as f:
                    writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter="\t")
                    writer.writeheader()
                    writer.writerows(kept)
        self.live.step = step + 1

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        from dvclive.plots import Metric

        if step is not None:
            self.live.step = step
        for key, value in values.items():
            value = _number(value)
            if Metric.could_log(value):
                self.live.log_metric(key, value, **kwargs)
        self.live.next_step()

    def finish(self) -> None:
        self.live.end()


TRACKERS: dict[str, type] = {"jsonl": JsonlTracker, "tensorboard": TensorBoardTracker, "wandb": WandBTracker,
                             "mlflow": MLflowTracker, "comet_ml": CometMLTracker, "aim": AimTracker,
                             "clearml": ClearMLTracker, "dvclive": DVCLiveTracker}
# trackio and swanlab are added by tracking.registry (optional_trackers), as are classes a script registers


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
