"""The configuration objects Accelerate users pass to `Accelerator(...)`, with Accelerate's field names.

Each is read by the part of hpc it configures: the data loaders (DataLoaderConfiguration), gradient accumulation
and the schedulers (GradientAccumulationPlugin), checkpoints and trackers (ProjectConfiguration). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc.errors import HpcError


@dataclass
class DataLoaderConfiguration:
    split_batches: bool = False  # the loader's batch is the global one, split over the ranks
    dispatch_batches: bool | None = None  # rank 0 reads and sends each rank its part (None: for iterable datasets)
    even_batches: bool = True  # the last batches repeat samples so every rank gets as many batches
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class GradientAccumulationPlugin:
    num_steps: int | None = None
    # schedulers never step on accumulation micro-steps either way (Accelerate only counts those calls)
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True  # the end of the data closes a window early
    sync_each_batch: bool = False  # all-reduce every micro-batch (less memory, more traffic)

    def __post_init__(self):
        if self.num_steps is not None and (not isinstance(self.num_steps, int) or self.num_steps < 1):
            raise HpcError(f"GradientAccumulationPlugin(num_steps={self.num_steps!r}) must be a whole number >= 1",
                           fix="use 1 or more")


@dataclass
class ProjectConfiguration:
    project_dir: str | None = None
    # trackers write their runs here (<logging_dir>/<project_name>); default project_dir, as in Accelerate, where
    # scripts and tools look for them. hpc's own JSONL log stays in project_dir/logs.
    logging_dir: str | None = None
    # hpc always names them: save_state() with no folder writes checkpoints/step-<N> (Accelerate's automatic naming
    # writes checkpoints/checkpoint_<iteration>)
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None  # checkpoints kept (at least 2: the newest may be damaged by a crash mid-save)
    iteration: int = 0
    save_on_each_node: bool = False  # refused: checkpoints go to the shared project folder

    def __post_init__(self):
        self.set_directories(self.project_dir)

    def set_directories(self, project_dir: str | None = None) -> None:
        self.project_dir = project_dir
        if self.logging_dir is None:
            self.logging_dir = project_dir
