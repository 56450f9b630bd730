"""How the job trains: the strategy (DDP, FSDP, DeepSpeed) and its settings.

One flat set of keys, shared by cluster profiles (a site's defaults), job files, ``--set`` and flags; they reach
the job's processes through the runtime config, where ``Accelerator`` reads them. Torch-free.
"""

from dataclasses import dataclass, field, fields
from typing import Literal

from hpc.contract import checks

Strategy = Literal["ddp", "fsdp", "deepspeed"]
ShardingStrategy = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
AutoWrapPolicy = Literal["TRANSFORMER_AUTO_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
StateDictType = Literal["FULL_STATE_DICT", "SHARDED_STATE_DICT"]


@dataclass(repr=False, eq=False, kw_only=True)
class TrainingSettings:
    # None everywhere: "not said here", so a lower layer (or Accelerator's own default) decides
    strategy: Strategy | None = None
    fsdp_sharding_strategy: ShardingStrategy | None = None
    fsdp_auto_wrap_policy: AutoWrapPolicy | None = None
    fsdp_transformer_layer_cls_to_wrap: list[str] | None = None
    fsdp_min_num_params: int | None = field(metadata={"check": checks.non_negative}, default=None)
    fsdp_cpu_offload: bool | None = None
    fsdp_activation_checkpointing: bool | None = None
    fsdp_state_dict_type: StateDictType | None = None
    fsdp_reshard_after_forward: bool | None = None  # None: what the sharding strategy implies
    # rank 0's weights are broadcast before sharding; with cpu_ram_efficient_loading, transformers loads the
    # pretrained weights on rank 0 only (the others build on the meta device) and they arrive that way
    fsdp_sync_module_states: bool | None = None
    fsdp_cpu_ram_efficient_loading: bool | None = None
    # reduce-scatter every micro-step: sharded gradients, less memory, more communication
    fsdp_sync_each_microstep: bool | None = None
    zero_stage: int | None = field(metadata={"check": checks.zero_stage}, default=None)
    offload_optimizer: bool | None = None
    offload_param: bool | None = None
    deepspeed_config: str | None = field(metadata={"check": checks.safe_value}, default=None)  # a JSON file
    gradient_clipping: float | None = field(metadata={"check": checks.non_negative_number}, default=None)
    # the Accelerator: CPU even where there are GPUs; collectives check that ranks agree on shapes (debug)
    use_cpu: bool | None = None
    debug: bool | None = None
    # torch.compile of each model in prepare() (Accelerate's TorchDynamoPlugin); "no" or None: not compiled
    dynamo_backend: str | None = field(metadata={"check": checks.safe_value}, default=None)
    dynamo_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None = None
    dynamo_use_fullgraph: bool | None = None
    dynamo_use_dynamic: bool | None = None
    dynamo_use_regional_compilation: bool | None = None  # compile each repeated block, not the whole model
    # checkpoints (project_dir/checkpoints/step-N): resume from the newest on start, how many to keep,
    # write in the background, fsync every file (survives a node crash; costs ~1 s per GiB)
    auto_resume: bool | None = None
    checkpoint_keep: int | None = field(metadata={"check": checks.checkpoint_keep}, default=None)
    checkpoint_async: bool | None = None
    checkpoint_fsync: bool | None = None
    # hang watchdog: no step for this many seconds (0: off; default 300 in a job) -> every rank's stack in the
    # logs, the stuck ranks named, the job ended, or requeued with hang_requeue
    hang_timeout: float | None = field(metadata={"check": checks.seconds}, default=None)
    hang_requeue: bool | None = None
    # a script that resumes itself (transformers' and diffusers' `--resume_from_checkpoint PATH`): the arguments
    # a requeued attempt gets, "{checkpoint}" standing for the newest verified checkpoint the script saved (or
    # hpc saved for it at the warning signal); with them, the warning signal stops the script at its next batch
    resume_args: list[str] | None = field(metadata={"check": checks.resume_args}, default=None)
    # where hpc saves for such a script at the warning signal, "{step}" standing for its optimizer steps, e.g.
    # out/step_{step}; default: the naming of the script's own last save_state
    resume_save_as: str | None = field(metadata={"check": checks.resume_save_as}, default=None)
    # stragglers: a rank whose steps take this many times the median rank's, window after window, is named in the
    # log, `hpc status` and the trackers; with straggler_action "requeue" the job checkpoints and runs again
    # without that rank's node
    straggler_threshold: float | None = field(metadata={"check": checks.ratio_above_one}, default=None)
    straggler_action: Literal["warn", "requeue"] | None = None
    # a webhook URL or an email address told of each change that matters (started, requeued, node excluded,
    # straggler, hang, failed, completed); a failed notice never fails the job
    notify: str | None = field(metadata={"check": checks.notify_target}, default=None)


TRAINING_KEYS = [f.name for f in fields(TrainingSettings)]


def training_values(obj) -> dict:
    """The training keys of a JobSpec or profile that are set, for the runtime config."""
    return {k: getattr(obj, k) for k in TRAINING_KEYS if getattr(obj, k) is not None}
