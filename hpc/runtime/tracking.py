"""Metrics, logged by the main process only: JSONL always; TensorBoard when it is installed and asked for.

A requeued or resumed job goes on with the same run (same files, same folder); what the interrupted attempt
logged after the checkpoint's step is superseded: TensorBoard purges those steps, the JSONL file gets a
`resumed_at` line, and rows after it replace earlier rows of a later step.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class JsonlTracker:
    name = "jsonl"

    def __init__(self, folder: Path, run_name: str, config: dict | None):
        folder.mkdir(parents=True, exist_ok=True)
        self.file = open(folder / f"{run_name}.jsonl", "a", buffering=1)
        if config:
            self.file.write(json.dumps({"config": config, "time": time.time()}, default=str) + "\n")

    def resumed_at(self, step: int) -> None:
        self.file.write(json.dumps({"resumed_at": step, "time": time.time()}) + "\n")

    def log(self, values: dict, step: int | None) -> None:
        self.file.write(json.dumps({"step": step, "time": time.time(), **values}, default=_number) + "\n")

    def finish(self) -> None:
        self.file.close()


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, folder: Path, run_name: str, config: dict | None):
        from torch.utils.tensorboard import SummaryWriter  # needs the optional `tensorboard` package

        self.folder = str(folder / run_name)
        self.writer = SummaryWriter(self.folder)

    def resumed_at(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer.close()  # the same folder again; what the last attempt logged after `step` is dropped
        self.writer = SummaryWriter(self.folder, purge_step=step + 1)

    def log(self, values: dict, step: int | None) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, _number(value), step)

    def finish(self) -> None:
        self.writer.close()


def _number(value):
    item = getattr(value, "item", None)
    return item() if callable(item) else value


TRACKERS = {"jsonl": JsonlTracker, "tensorboard": TensorBoardTracker}
