"""Combine defaults, profile, job file, HPC_* environment and flags into one JobSpec, with provenance.

CLI flag > HPC_* environment > job file (--config) > cluster profile > built-in defaults.
"""



import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Mapping

from hpc.cluster.config import files, profiles, scheduler_keys
from hpc.cluster.config.effective import Effective
from hpc.cluster.config.schema import PROFILE_DEFAULTS, ClusterProfile, JobSpec, record
from hpc.contract.validate import check_field, field_names, unknown_key_error
from hpc.errors import ConfigError, HpcError, shown
from hpc.slurm import formats

ENV_PREFIX = "HPC_"


@record
class Layer:
    """One source of values. ``where`` names it in errors; ``spell`` turns a key into how the user wrote it."""

    label: str  # shown by --explain
    where: str
    values: Mapping[str, Any]
    from_text: bool = False
    spell: Any = staticmethod(lambda key: key)
    notes: list = dataclasses.field(default_factory=list)  # one line each, for the user (Accelerate's settings)


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def env_layer(environ: Mapping[str, str] | None = None) -> Layer:
    environ = os.environ if environ is None else environ
    names = set(field_names(JobSpec))
    values = {k[len(ENV_PREFIX):].lower(): v for k, v in environ.items()
              if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in names}
    return Layer("env", "environment", values, from_text=True, spell=lambda k: ENV_PREFIX + k.upper())


def job_file_layer(path: str | Path, label: str | None = None) -> Layer:
    path = Path(path)
    if not files.is_file(path):
        raise HpcError(f"job file {shown(str(path))} does not exist", fix="check the --config path")
    data = profiles.read_yaml(path)
    for key, value in data.items():
        if key not in field_names(JobSpec):
            raise unknown_key_error(str(path), key, value, field_names(JobSpec))
    return Layer(label or f"job file {path}", str(path), data)


def set_layer(assignments: list[str]) -> Layer:
    values = {}
    for item in assignments:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep:
            raise ConfigError("command line", "--set", item, "must be KEY=VALUE", "write e.g. --set nodes=2")
        if key not in field_names(JobSpec):
            raise unknown_key_error("command line", f"--set {key}", value, field_names(JobSpec))
        values[key] = value
    return Layer("--set", "command line", values, from_text=True, spell=lambda k: f"--set {k}")


def api_layer(keys: Mapping[str, Any]) -> Layer:
    """Keyword arguments of hpc.submit(); typed values, checked like a job file's."""
    for key, value in keys.items():
        if key not in field_names(JobSpec):
            raise unknown_key_error("hpc.submit()", key, value, field_names(JobSpec))
    return Layer("hpc.submit()", "hpc.submit()", dict(keys), spell=lambda k: f"{k}=")


def accelerate_layer(translation, label: str, where: str) -> Layer:
    """Accelerate's settings (a config file, `accelerate launch` flags), already in hpc's keys."""
    return Layer(label, where, translation.values, from_text=True, spell=lambda k: translation.origin.get(k, k),
                 notes=[*translation.notes, *translation.slurm_notes])


def default_layers(config_file: str | None, environ: Mapping[str, str] | None = None) -> list[Layer]:
    """The files read without being named, then --config_file; lowest first: Accelerate's default config file
    (where Accelerate looks for it), hpc's own default job file (`hpc config` writes it), an Accelerate file."""
    from hpc.cluster.config import accelerate_file

    layers = []
    default = accelerate_file.default_path(environ)
    if default is not None:
        layers.append(accelerate_layer(accelerate_file.translate(default, default_file=True),
                                       f"accelerate default config {default}",
                                       str(default)))
    own = default_job_file()
    if own.is_file():
        layers.append(job_file_layer(own, label=f"default job file {own}"))
    if config_file:
        layers.append(accelerate_layer(accelerate_file.translate(config_file), f"accelerate config {config_file}",
                                       str(config_file)))
    return layers


def default_job_file() -> Path:
    from hpc.cluster.folders import user_config_dir

    return user_config_dir() / "job.yaml"


_POSITIONAL = {"script": "TARGET", "command": "TARGET", "args": "ARGS"}


def flag_layer(flags: Mapping[str, Any]) -> Layer:
    return Layer("flag", "command line", {k: v for k, v in flags.items() if v is not None},
                 from_text=True, spell=lambda k: _POSITIONAL.get(k) or flag_name(k))


def _profile_layers(profile: ClusterProfile, origin: Mapping[str, Path]) -> list[Layer]:
    """The profile's job defaults, one layer per file along ``extends`` so each value names its file. A dotted
    profile key (``rendezvous.last_call_timeout``) is one key of a section."""
    by_file: dict[Path, dict[str, Any]] = {}
    for job_key, prof_key in PROFILE_DEFAULTS.items():
        if prof_key in origin:  # only what the profile (or an ancestor) really says
            value: Any = profile
            for part in prof_key.split("."):
                value = getattr(value, part)
            by_file.setdefault(origin[prof_key], {})[job_key] = value
    return [Layer(f"profile {path.name}", str(path), values) for path, values in by_file.items()]


def resolve(profile_ref: str | None, layers: list[Layer]) -> Effective:
    """Load the profile and apply ``layers`` (lowest precedence first) over it."""
    profile, path, origin = profiles.load(profile_ref)
    stack = [*_profile_layers(profile, origin), *layers]
    values: dict[str, Any] = {}
    notes = [note for layer in stack for note in layer.notes]
    sources: dict[str, str] = {}
    located: dict[str, tuple[str, str]] = {}  # key -> (file or "command line"/"environment", key as written)
    level: dict[str, int] = {}  # key -> index of the layer that set it
    for i, layer in enumerate(stack):
        for key, raw in layer.values.items():
            spelled = layer.spell(key)
            checked = check_field(JobSpec, key, raw, layer.where, spelled, from_text=layer.from_text)
            if key == "env" and isinstance(values.get("env"), dict):
                checked = {**values["env"], **checked}  # variables add up, as `--env` and profiles' env do
            values[key] = checked
            sources[key] = f"{layer.label} ({spelled})" if layer.from_text else layer.label
            located[key] = (layer.where, spelled)
            level[key] = i
    if values.get("mem") and values.get("mem_per_gpu"):
        # they exclude each other: the one set higher up wins
        loser, winner = ("mem", "mem_per_gpu") if level["mem"] < level["mem_per_gpu"] else ("mem_per_gpu", "mem")
        values.pop(loser)
        sources[loser] = f"dropped ({winner} is set higher up)"
    if values.get("num_processes") and values.get("nproc_per_node"):
        # Accelerate's total and hpc's per node: the one set higher up wins; both on the command line, they must
        # agree (checked once nodes is known)
        same_line = located["num_processes"][0] == located["nproc_per_node"][0] == "command line"
        if not same_line and level["num_processes"] < level["nproc_per_node"]:
            values.pop("num_processes")
            sources["num_processes"] = "dropped (nproc_per_node is set higher up)"
        elif not same_line and level["num_processes"] > level["nproc_per_node"]:
            values.pop("nproc_per_node")
            sources.pop("nproc_per_node", None)
    job = JobSpec(**values)
    job, derived = _derive(job, profile, sources)
    sources.update(derived)
    if "nodes" in derived and "elastic" in located:
        located["nodes"] = located["elastic"]  # a derived value is blamed on the key it came from
    _check_against_profile(job, profile, located)
    return Effective(job, profile, path, sources, notes)


def _derive(job: JobSpec, profile: ClusterProfile, sources: dict[str, str]) -> tuple[JobSpec, dict[str, str]]:
    """Values that follow from others: tasks per node, processes per node, elastic node count.

    srun starts one task per GPU (or CPU slot); torchrun and deepspeed start one agent per node,
    which starts nproc_per_node processes.
    """
    changes: dict[str, Any] = {}
    derived: dict[str, str] = {}
    if job.gpus_per_node:
        slots, why = job.gpus_per_node, "one per GPU"
    elif profile.tasks_per_node:
        slots, why = profile.tasks_per_node, "profile tasks_per_node"
    else:
        slots, why = 1, "one per node"
    srun = job.launcher == "srun"
    if job.num_processes and job.nproc_per_node is None and job.num_processes % job.nodes == 0:
        nproc = job.num_processes // job.nodes
        job = dataclasses.replace(job, nproc_per_node=nproc)
        changes["nproc_per_node"], derived["nproc_per_node"] = nproc, "derived (num_processes / nodes)"
    tasks = job.ntasks_per_node
    if tasks is None:
        if srun and job.nproc_per_node:
            tasks, why_tasks = job.nproc_per_node, "nproc_per_node"
        else:
            tasks, why_tasks = (slots, why) if srun else (1, "one agent per node")
        changes["ntasks_per_node"], derived["ntasks_per_node"] = tasks, f"derived ({why_tasks})"
    if job.nproc_per_node is None:
        nproc, why_nproc = (tasks, "ntasks_per_node") if srun else (slots, why)
        changes["nproc_per_node"], derived["nproc_per_node"] = nproc, f"derived ({why_nproc})"
    if "job_name" not in sources:
        name = _name_from_target(job)
        if name:
            changes["job_name"], derived["job_name"] = name, "derived (from what it runs)"
    if job.elastic_range and "nodes" not in sources:
        changes["nodes"], derived["nodes"] = job.elastic_range[1], "derived (elastic MAX)"
    if job.min_nodes is not None and job.min_nodes == changes.get("nodes", job.nodes):
        # the job without it (how a job file turns a profile's min_nodes off): from here on, min_nodes set means
        # the job may run on fewer nodes
        changes["min_nodes"] = None
        derived["min_nodes"] = f"dropped ({sources['min_nodes']}: {job.min_nodes} = nodes, runs on exactly those)"
    return (dataclasses.replace(job, **changes) if changes else job), derived


def _check_min_nodes(job: JobSpec, fail) -> None:
    """min_nodes: 1..nodes, and nothing else deciding how many nodes the job runs on (min_nodes = nodes was
    dropped by _derive: the job runs on exactly its nodes, as without it)."""
    if job.min_nodes > job.nodes:
        fail("min_nodes", f"exceeds the job's {job.nodes} node(s)", f"give 1 to {job.nodes}, or drop min_nodes")
    if job.elastic:
        fail("min_nodes", f"cannot be combined with --elastic {job.elastic}, which has its own MIN",
             "drop min_nodes (an elastic job goes down to its MIN by itself)")
    if job.spare_nodes:
        fail("min_nodes", f"cannot be combined with spare_nodes {job.spare_nodes}: a job with spares always asks for "
             "its N to N+K nodes", "drop one of --min-nodes and --spare-nodes")
    if job.nodelist:
        fail("min_nodes", f"cannot be combined with nodelist {job.nodelist}: SLURM runs the job on every node it "
             "names, or not at all", "drop one of --min-nodes and --nodelist")


def _name_from_target(job: JobSpec) -> str | None:
    raw = job.module or job.script or (job.command[0] if job.command else None)
    if not raw:
        return None
    stem = Path(raw).name.removesuffix(".py").rsplit(".", 1)[-1] if job.module else Path(raw).name.removesuffix(".py")
    name = re.sub(r"[^A-Za-z0-9._+-]", "-", stem).lstrip("._+-")[:64]
    return name or None


def _check_against_profile(job: JobSpec, profile: ClusterProfile, located: dict[str, tuple[str, str]]) -> None:
    """Rules between keys; the error names where the offending key was set."""

    def fail(key: str, problem: str, fix: str) -> None:
        where, spelled = located.get(key, ("defaults", key))
        raise ConfigError(where, spelled, getattr(job, key), problem, fix)

    targets = [k for k in ("script", "module", "command") if getattr(job, k)]
    if len(targets) > 1:
        fail(targets[1], f"cannot be combined with {targets[0]}", "give one of a script, -m MODULE or a command")
    if profile.max_nodes and job.nodes > profile.max_nodes:
        fail("nodes", f"exceeds the profile's max_nodes {profile.max_nodes}",
             f"ask for at most {profile.max_nodes} nodes")
    if profile.max_time:
        limit, asked = formats.parse_time(profile.max_time), formats.parse_time(job.time)
        if limit is not None and (asked is None or asked > limit):
            fail("time", f"exceeds the profile's max_time {profile.max_time}", f"ask for at most {profile.max_time}")
    if job.elastic_range:
        lo, hi = job.elastic_range
        if job.launcher != "torchrun":
            fail("elastic", "needs the torchrun launcher", "add --launcher torchrun")
        if not lo <= job.nodes <= hi:
            fail("nodes", f"is outside the elastic range {job.elastic}", f"ask for between {lo} and {hi} nodes")
    if job.min_nodes is not None:
        _check_min_nodes(job, fail)
    if job.rdzv_last_call_timeout >= job.rdzv_join_timeout:
        # a round's last call must end before a node's join gives up, or no round with fewer than MAX nodes forms
        fail("rdzv_last_call_timeout", f"is not shorter than rdzv_join_timeout ({job.rdzv_join_timeout})",
             "lower rdzv_last_call_timeout or raise rdzv_join_timeout")
    refused = scheduler_keys.refused_key(job, profile)
    if refused is not None:
        fail(*refused)
    if job.array and job.sweep:
        fail("sweep", "cannot be combined with --array (a sweep is an array of its own)", "drop one of them")
    if job.offload_param and job.strategy == "deepspeed" and job.zero_stage != 3:
        fail("offload_param", "needs ZeRO stage 3 (only stage 3 partitions parameters)", "set zero_stage 3")
    if job.num_processes and job.num_processes != job.nodes * job.nproc_per_node:
        fail("num_processes", f"is not {job.nodes} nodes x {job.nproc_per_node} processes (it counts the processes "
             "of all nodes, as Accelerate's does)", f"ask for a multiple of {job.nodes}, or drop it")
    if job.cpu_bind and job.launcher == "deepspeed":
        fail("cpu_bind", "cannot reach the ranks: DeepSpeed's runner starts its own srun",
             "use the srun or torchrun launcher, or drop cpu_bind")
    if job.launcher == "srun" and job.nproc_per_node != job.ntasks_per_node:
        fail("nproc_per_node", "differs from ntasks_per_node, but srun starts one process per task",
             "drop --nproc-per-node, or use --launcher torchrun")
