"""Accelerate's Trackio and SwanLab trackers. Their packages are optional: asking for one that is not installed
is refused in one line when log_with is read (trackers.resolve), and building one directly says the same."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from hpc.errors import HpcError
from hpc.runtime.tracking.trackers import _LibraryTracker, _number


def _need(package: str, tracker: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise HpcError(f"the {tracker} tracker needs the {package} package, which is not installed",
                       fix=f"pip install {package}, or drop {tracker!r} from log_with")


class _PackageRun(_LibraryTracker):
    """What the two have alike: their package's run (``self.run``), with a wandb-like config, log and finish."""

    package: str

    @property
    def tracker(self):
        return self.run

    def store_init_configuration(self, values: dict) -> None:
        importlib.import_module(self.package).config.update(values, allow_val_change=True)

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.run.log({k: _number(v) for k, v in values.items()}, step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


class TrackioTracker(_PackageRun):
    """A trackio run in project ``run_name`` (init_kwargs={"trackio": {...}} go to trackio.init)."""

    name = "trackio"
    package = "trackio"

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        _need(self.package, self.name)
        import trackio

        self.run = trackio.init(project=run_name, **kwargs)
        if config:
            self.store_init_configuration(config)


class SwanLabTracker(_PackageRun):
    """A SwanLab run in project ``run_name`` (init_kwargs={"swanlab": {...}} go to swanlab.init)."""

    name = "swanlab"
    package = "swanlab"

    def __init__(self, folder: Path, run_name: str, config: dict | None, **kwargs):
        super().__init__()
        _need(self.package, self.name)
        import swanlab

        kwargs.setdefault("logdir", str(folder))
        self.run = swanlab.init(project=run_name, **kwargs)
        if config:
            self.store_init_configuration(config)

    def log_images(self, values: dict, step: int | None = None, **kwargs) -> None:
        import swanlab

        self.log({k: [swanlab.Image(image) for image in v] for k, v in values.items()}, step=step, **kwargs)
