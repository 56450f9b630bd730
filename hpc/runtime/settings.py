"""The Accelerator's settings as plain values: what the resolver (settings_resolver.py) hands the rest of the run.

A leaf: it imports nothing of the runtime, so the checkpoint, resilience and process rooms read their settings
here without importing the resolver (which knows every plugin and strategy). `job_setting` answers what an
Accelerator built now would read, for PartialState and AcceleratorState, which may come before any Accelerator.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc.contract import accelerate_settings
from hpc.contract.runtime_config import RuntimeConfig, current_config

# seconds without a step before a job's ranks are declared hung (profile/job key hang_timeout; 0: off). Far below
# torch's own collective timeouts (gloo 30 min, NCCL 10 min), above any sane step; saves and loads are exempt.
DEFAULT_HANG_TIMEOUT_S = 300.0
# a rank that never comes to a sharded save is named after the job's hang timeout, else after this
DEFAULT_ARRIVAL_TIMEOUT_S = 600.0
# a rank whose own part of a step takes this many times the median rank's, window after window, is a straggler
DEFAULT_STRAGGLER_THRESHOLD = 1.5
MIN_KEEP = 2  # checkpoints kept: the newest may turn out damaged, there must always be one before it


def job_values(config: RuntimeConfig | None) -> tuple[dict, list[str]]:
    """The job's settings as flat keys, the runtime config's above the ACCELERATE_* variables', and a note for
    each variable hpc honours differently."""
    from_env = accelerate_settings.from_environ(os.environ)
    own = config.as_dict() if config is not None else {}
    return {**from_env.values, **{k: v for k, v in own.items() if v is not None}}, from_env.notes


def job_setting(key: str):
    """What an Accelerator built now would read for ``key`` when no argument says otherwise."""
    return job_values(current_config())[0].get(key)


@dataclass(frozen=True)
class Resilience:
    """What the run guard needs: resume, hang and preemption settings."""

    in_job: bool  # started by hpc (a runtime config): the hang watchdog and the warning signal are on
    auto_resume: bool
    hang_timeout_s: float
    hang_requeue: bool
    requeue_signal: str  # the profile's warning signal
    max_requeues: int
    lead_time_s: float | None  # checked only where the scheduler warns ahead of the time limit
    # a script that resumes itself (resume_args): stopped by hpc at a batch after the warning signal, its
    # checkpoints noted for the next attempt's --resume_from_checkpoint
    script_resumes: bool
    resume_save_as: str | None
    # stragglers (resilience/stragglers.py), checked in a job: named ("warn") or requeued without ("requeue")
    straggler_threshold: float = DEFAULT_STRAGGLER_THRESHOLD
    straggler_action: str = "warn"


@dataclass(frozen=True)
class Checkpointing:
    directory: Path
    keep: int
    async_save: bool
    fsync: bool
    arrival_timeout_s: float
    # the profile's fast tier (contract FastTier) when it is on and the run is an hpc job; None: off
    fast_tier: Any = None


@dataclass(frozen=True)
class AcceleratorSettings:
    dataloader_config: Any  # a DataLoaderConfiguration
    project_configuration: Any  # a ProjectConfiguration
    project_dir: Path
    strategy: str | None  # "ddp", "fsdp", "deepspeed" or None (DDP with several processes)
    plugin: Any
    needs_process_group: bool  # even with one process
    mixed_precision: str
    accumulation_steps: int
    handlers: dict
    process_group: Any  # InitProcessGroupKwargs
    cpu: bool
    debug: bool
    compile: Any  # parallel.compile.Compile
    notes: list[str]  # one line each, printed by the main process
    resilience: Resilience
    checkpointing: Checkpointing
    parallelism: Any = None  # a ParallelismConfig with a mesh to build (tp, dp_shard or cp > 1), else None
    tp_plan: dict | None = None  # a tensor-parallel plan given with torch_tp_plugin
