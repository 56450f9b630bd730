"""The typed shapes of a cluster profile and of a job.

A profile says what a cluster is; a JobSpec says what one job asks for. Profile values are the
defaults of the job's values (see ``PROFILE_DEFAULTS``); precedence decides the rest.
"""


from dataclasses import field
from typing import Literal, get_args

from hpc.contract import checks
from hpc.contract.launch_settings import (  # noqa: F401 - Launcher, Preemption, Vetting: the profile's too
    RDZV_JOIN_TIMEOUT,
    RDZV_KEEP_ALIVE_INTERVAL,
    RDZV_KEEP_ALIVE_MAX_ATTEMPT,
    RDZV_LAST_CALL_TIMEOUT,
    FastTier,
    Launcher,
    Preemption,
    Rendezvous,
    Vetting,
    record,
)
from hpc.contract.launch_settings import ReprByFields as _Repr
from hpc.contract.launch_settings import checked as _check
from hpc.contract.training import TRAINING_KEYS, TrainingSettings
from hpc.errors import ConfigError
from hpc.slurm import formats

Scheduler = Literal["slurm", "local"]
SCHEDULERS = get_args(Scheduler)  # one backend each (hpc.cluster.backends)


@record
class Container(_Repr):
    """Run every task inside a container image."""

    runtime: Literal["apptainer", "pyxis"]
    image: str
    mounts: list[str] = field(default_factory=list)
    options: list[str] = _check(checks.shell_lines, default_factory=list)




@record
class Remote(_Repr):
    """The cluster's login node, reached over SSH: every command then works from a machine without SLURM."""

    host: str = _check(checks.ssh_destination)  # a host name, user@host, or an alias from ~/.ssh/config
    job_root: str = _check(checks.remote_folder)  # the folder on the cluster that holds the job folders
    user: str | None = _check(checks.safe_value, default=None)
    port: int | None = _check(checks.positive, default=None)
    identity_file: str | None = _check(checks.safe_value, default=None)
    jump_host: str | None = _check(checks.ssh_destination, default=None)  # ssh -J
    known_hosts: str | None = _check(checks.safe_value, default=None)  # a known_hosts file of its own
    # lines run before every command on the login node (module load slurm, export SLURM_CONF=...)
    env: list[str] = _check(checks.shell_lines, default_factory=list)
    connect_timeout: int = _check(checks.positive, default=10)


@record
class LostNodes(_Repr):
    """How the job script tells a dead node from a slow end: once a task has failed and the step is still there
    ``after`` s later, each node none of whose tasks ended is probed (``srun -w NODE true``); one that does not
    answer within ``probe_timeout`` s, twice (the second once the controller answers: a busy one fails probes
    too), is lost, and the next attempt excludes it."""

    after: int = _check(checks.positive, default=20)
    probe_timeout: int = _check(checks.positive, default=10)


@record
class ClusterProfile(TrainingSettings, _Repr):
    name: str = _check(checks.job_name)
    description: str = ""
    scheduler: Scheduler = "slurm"
    partition: str | None = _check(checks.safe_value, default=None)
    account: str | None = _check(checks.safe_value, default=None)
    qos: str | None = _check(checks.safe_value, default=None)
    constraint: str | None = _check(checks.constraint, default=None)
    reservation: str | None = _check(checks.safe_value, default=None)
    max_nodes: int | None = _check(checks.positive, default=None)
    # slurm.conf's MaxArraySize (array indices stay below it); None: SLURM's default, 1001
    max_array_size: int | None = _check(checks.max_array_size, default=None)
    gpus_per_node: int = _check(checks.non_negative, default=0)
    gpu_type: str | None = _check(checks.safe_value, default=None)
    gpu_memory: str | None = _check(checks.memory, default=None)  # one GPU's memory, for estimate-memory
    # how GPUs are asked for: --gpus-per-node=N, or --gres=gpu[:type]:N on sites that predate it
    gres_style: Literal["gpus-per-node", "gres"] = "gpus-per-node"
    tasks_per_node: int | None = _check(checks.positive, default=None)  # srun tasks on CPU-only nodes
    cpus_per_task: int | None = _check(checks.positive, default=None)
    mem: str | None = _check(checks.memory, default=None)
    mem_per_gpu: str | None = _check(checks.memory, default=None)
    default_time: str = _check(checks.time_limit, default="01:00:00")
    max_time: str | None = _check(checks.time_limit, default=None)
    modules: list[str] = _check(checks.module_names, default_factory=list)
    setup: list[str] = _check(checks.shell_lines, default_factory=list)
    env: dict[str, str] = _check(checks.env_values, default_factory=dict)
    network_interface: str | None = _check(checks.safe_value, default=None)
    launcher: Launcher = "srun"
    cpu_bind: str | None = _check(checks.cpu_bind, default=None)  # srun --cpu-bind for every task
    # None: the interpreter running hpc (the same venv, on a shared filesystem); sites with modules say python3
    python: str | None = _check(checks.safe_value, default=None)
    container: Container | None = None
    remote: Remote | None = None
    preemption: Preemption = field(default_factory=Preemption)
    lost_nodes: LostNodes = field(default_factory=LostNodes)
    rendezvous: Rendezvous = field(default_factory=Rendezvous)  # elastic torchrun jobs' defaults (rdzv_* keys)
    # shell lines each node runs before the ranks start (exit 0: healthy), e.g. a site's node health check
    health_check: list[str] = _check(checks.shell_lines, default_factory=list)
    vetting: Vetting = field(default_factory=Vetting)
    # checkpoints in node memory, copied to a peer node (hpc.runtime.checkpoint.tiers; docs/checkpoint-tiers.md)
    fast_tier: FastTier = field(default_factory=FastTier)
    spare_nodes: int = _check(checks.non_negative, default=0)  # the job's default
    hot_spares: bool = True  # the job's default
    min_nodes: int | None = _check(checks.min_nodes, default=None)  # the job's default
    sbatch_extra: list[str] = _check(checks.sbatch_extra, default_factory=list)
    template: str | None = _check(checks.safe_value, default=None)
    hostfile_format: Literal["deepspeed", "mpi"] = "deepspeed"
    output_dir: str = _check(checks.safe_value, default="hpc-jobs")
    snapshot_include: list[str] | None = None
    snapshot_exclude: list[str] = field(default_factory=list)

    def validate(self, source: str) -> None:
        if self.mem and self.mem_per_gpu:
            raise ConfigError(source, "mem_per_gpu", self.mem_per_gpu, "cannot be set together with mem",
                              "keep one of mem and mem_per_gpu")
        if self.max_time and _exceeds(self.default_time, self.max_time):
            raise ConfigError(source, "default_time", self.default_time, f"exceeds max_time {self.max_time}",
                              "lower default_time or raise max_time")


def _exceeds(time: str, limit: str) -> bool:
    t, lim = formats.parse_time(time), formats.parse_time(limit)
    return lim is not None and (t is None or t > lim)


@record
class JobSpec(TrainingSettings, _Repr):
    """Everything one job asks for, after precedence. Field names are the keys of job files and --set."""

    job_name: str = _check(checks.job_name, default="hpc-job")
    # what to run: exactly one of script, module, command
    script: str | None = None
    module: str | None = None
    command: list[str] | None = None
    args: list[str] = _check(checks.shell_lines, default_factory=list)
    nodes: int = _check(checks.positive, default=1)
    nodelist: str | None = _check(checks.nodelist, default=None)
    ntasks_per_node: int | None = _check(checks.positive, default=None)
    nproc_per_node: int | None = _check(checks.positive, default=None)
    # processes in all, as `accelerate launch --num_processes` counts them: nproc_per_node = num_processes / nodes
    num_processes: int | None = _check(checks.positive, default=None)
    gpus_per_node: int = _check(checks.non_negative, default=0)
    gpu_ids: str | None = _check(checks.gpu_ids, default=None)  # this machine's GPUs to use (local profile)
    cpus_per_task: int | None = _check(checks.positive, default=None)
    mem: str | None = _check(checks.memory, default=None)
    mem_per_gpu: str | None = _check(checks.memory, default=None)
    time: str = _check(checks.time_limit, default="01:00:00")
    partition: str | None = _check(checks.safe_value, default=None)
    account: str | None = _check(checks.safe_value, default=None)
    qos: str | None = _check(checks.safe_value, default=None)
    constraint: str | None = _check(checks.constraint, default=None)
    reservation: str | None = _check(checks.safe_value, default=None)
    launcher: Launcher = "srun"
    cpu_bind: str | None = _check(checks.cpu_bind, default=None)
    # OMP_NUM_THREADS of each process (default: cpus_per_task, else the node's CPUs shared by its processes)
    cpu_threads_per_process: int | None = _check(checks.positive, default=None)
    main_process_port: int | None = _check(checks.port, default=None)  # rendezvous port (default: from the job id)
    elastic: str | None = _check(checks.elastic, default=None)
    max_restarts: int = _check(checks.non_negative, default=0)
    # nodes allocated beyond `nodes`: vetting starts the job on the best `nodes` of them
    spare_nodes: int = _check(checks.non_negative, default=0)
    # an srun job's spares stay allocated through the job, a lost node's place going to one (false: vetting gives
    # them back to the cluster); an elastic job's always wait in its rendezvous
    hot_spares: bool = True
    # a requeue that cannot get `nodes` fit nodes (nodes excluded for the job's life) runs on down to this many;
    # resolved, it is None or below `nodes` (min_nodes = nodes is the job without it, and resolves to None)
    min_nodes: int | None = _check(checks.min_nodes, default=None)
    vet: bool | None = None  # vet the nodes before the ranks start (None: the profile's vetting.enabled decides)
    monitor_interval: float | None = _check(checks.positive_seconds, default=None)  # between torchrun's checks
    # an elastic job's c10d rendezvous (torchrun --rdzv_conf), whole seconds; the profile's `rendezvous` section
    # holds the defaults (see hpc.contract.launch_settings.Rendezvous)
    rdzv_join_timeout: int = _check(checks.positive, default=RDZV_JOIN_TIMEOUT)
    rdzv_last_call_timeout: int = _check(checks.positive, default=RDZV_LAST_CALL_TIMEOUT)
    rdzv_keep_alive_interval: int = _check(checks.positive, default=RDZV_KEEP_ALIVE_INTERVAL)
    rdzv_keep_alive_max_attempt: int = _check(checks.positive, default=RDZV_KEEP_ALIVE_MAX_ATTEMPT)
    array: str | None = _check(checks.array, default=None)
    sweep: str | None = None
    after: list[str] = _check(checks.after, default_factory=list)
    env: dict[str, str] = _check(checks.env_values, default_factory=dict)
    env_passthrough: list[str] | None = _check(checks.env_names, default=None)
    output_dir: str = _check(checks.safe_value, default="hpc-jobs")
    template: str | None = _check(checks.safe_value, default=None)
    # code snapshot outside git: file name patterns to take, and folder/file patterns to leave out
    snapshot_include: list[str] | None = None
    snapshot_exclude: list[str] = field(default_factory=list)
    # in-job settings, read by Accelerator from the runtime config (arguments in code override them)
    mixed_precision: Literal["no", "bf16", "fp16", "fp8"] | None = None
    gradient_accumulation_steps: int | None = _check(checks.positive, default=None)

    @property
    def elastic_range(self) -> tuple[int, int] | None:
        if not self.elastic:
            return None
        lo, hi = self.elastic.split(":")
        return int(lo), int(hi)

    @property
    def replaces_lost_nodes(self) -> bool:
        """A plain srun job with spare nodes keeps them allocated, idle: a lost node's place goes to one and the step
        runs again within the attempt (an elastic job's spares wait in torch's rendezvous instead)."""
        return bool(self.spare_nodes) and self.hot_spares and not self.elastic and self.launcher == "srun"


# job key <- profile key: the profile's value is the job's default
PROFILE_DEFAULTS = {
    "partition": "partition",
    "account": "account",
    "qos": "qos",
    "constraint": "constraint",
    "reservation": "reservation",
    "gpus_per_node": "gpus_per_node",
    "cpus_per_task": "cpus_per_task",
    "mem": "mem",
    "mem_per_gpu": "mem_per_gpu",
    "time": "default_time",
    "launcher": "launcher",
    "cpu_bind": "cpu_bind",
    "spare_nodes": "spare_nodes",
    "hot_spares": "hot_spares",
    "min_nodes": "min_nodes",
    "output_dir": "output_dir",
    "template": "template",
    # a dotted key: one key of a profile section
    "rdzv_join_timeout": "rendezvous.join_timeout",
    "rdzv_last_call_timeout": "rendezvous.last_call_timeout",
    "rdzv_keep_alive_interval": "rendezvous.keep_alive_interval",
    "rdzv_keep_alive_max_attempt": "rendezvous.keep_alive_max_attempt",
    "snapshot_include": "snapshot_include",
    "snapshot_exclude": "snapshot_exclude",
    **{key: key for key in TRAINING_KEYS},  # a site's training defaults (strategy, ZeRO stage, ...)
}
