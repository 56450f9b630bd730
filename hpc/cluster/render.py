"""Render a job into the text SLURM (or this machine) runs: the batch script, a hostfile, the runtime config.

``render()`` is what a backend's plan is made of (``hpc.cluster.backends``): the plan is the one code path behind
``hpc render``, ``hpc submit --dry-run`` and ``hpc submit``, so a dry run shows byte for byte what gets submitted.
Everything that differs between schedulers comes from the backend.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import jinja2.sandbox

from hpc.cluster import sweep as sweeps
from hpc.cluster.config.effective import Effective
from hpc.cluster.config.schema import ClusterProfile, JobSpec
from hpc.cluster.folders import builtin_dir, note_once, replaces_builtin, search_path, user_cache_dir
from hpc.cluster.ownership import insecure
from hpc.contract import layout, mesh_sizes
from hpc.errors import HpcError
from hpc.slurm.array_spec import indices as array_indices


@dataclass(frozen=True)
class RenderedJob:
    """What ``render`` makes of a job; a backend's ``Plan`` adds the folder and the submit command."""

    script: str
    script_name: str
    template: str
    hostfile: str | None
    runtime_config: dict
    effective: Effective
    directives: list[str] = field(default_factory=list)
    array: list[int] | None = None  # array task ids; None for a plain job


def shell_quote(value) -> str:
    return shlex.quote(str(value))


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates, keyed by their source's checksum: compiling them is most of a render's time. The
    cache is code Jinja runs: it is used only in a folder no one else can write."""
    # not the folder of an hpc whose compiled templates were not sandboxed (a source's checksum is the key)
    directory = user_cache_dir() / "jinja-sandboxed"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home only costs speed
    if insecure(directory) is not None:
        return None
    return jinja2.FileSystemBytecodeCache(str(directory))


class _Templates(jinja2.FileSystemLoader):
    """The search path's loader, noting (once, on stderr) each template of the project's or the user's folder
    that takes the place of a built-in one: a copied ./job_templates can silently change every job."""

    def __init__(self):
        super().__init__([str(p) for p in search_path("job_templates")])
        self.builtin = builtin_dir("job_templates").resolve()

    def get_source(self, environment, template):
        source, filename, uptodate = super().get_source(environment, template)
        if filename and not Path(filename).resolve().is_relative_to(self.builtin) \
                and replaces_builtin(Path(filename), self.builtin / template):
            note_once(f"hpc: note: job template {filename} takes the place of the built-in {template}")
        return source, filename, uptodate


def _environment() -> jinja2.Environment:
    # sandboxed: a template (one from ./job_templates too) cannot reach Python beyond the values it is given
    env = jinja2.sandbox.SandboxedEnvironment(
        loader=_Templates(),
        bytecode_cache=_bytecode_cache(),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        # bash's ${#array[@]} would open a Jinja comment
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["q"] = shell_quote
    env.filters["qjoin"] = lambda items: " ".join(shell_quote(i) for i in items)
    env.filters["with_checkpoint"] = _with_checkpoint
    return env


def _with_checkpoint(args: list[str]) -> str:
    """resume_args as shell words, each quoted, with "{checkpoint}" becoming the batch shell's "$checkpoint"."""
    words = []
    for arg in args:
        pieces = arg.split("{checkpoint}")
        word = '"$checkpoint"'.join(shell_quote(p) if p else "" for p in pieces)
        words.append(word or shell_quote(arg))
    return " ".join(words)


def template_name(job: JobSpec, backend) -> str:
    if job.template:
        return job.template if job.template.endswith(".j2") else f"{job.template}.j2"
    return backend.template(job)


def python(profile: ClusterProfile) -> str:
    return profile.python or sys.executable


def target_argv(job: JobSpec, profile: ClusterProfile) -> list[str]:
    """The program each process runs (before the launcher's own wrapping)."""
    if job.module:
        return [python(profile), "-m", job.module, *job.args]
    if job.script:
        prog = [python(profile), job.script] if job.script.endswith(".py") else [job.script]
        return [*prog, *job.args]
    if job.command:
        return [*job.command, *job.args]
    raise HpcError("nothing to run", fix="give a script (train.py), -m MODULE, or a command after the options")


def launcher_target(job: JobSpec) -> list[str]:
    """What torchrun is told to run (DeepSpeed's runner gets hpc's own target, see deepspeed.sbatch.j2)."""
    if job.module:
        return ["--module", job.module, *job.args]
    if job.script and job.script.endswith(".py"):
        return [job.script, *job.args]
    prog = [job.script] if job.script else list(job.command or [])
    return ["--no-python", *prog, *job.args]


def warm_target(job: JobSpec, wrap: list[str]) -> list[str] | None:
    """What hpc.runtime.launch.local_ranks forks the local ranks to run: a Python script or module of more than
    one rank, outside a container; None for anything else (each rank then starts on its own)."""
    if wrap or job.nproc_per_node < 2:
        return None
    target = launcher_target(job)  # torchrun's spelling, which local_ranks takes too
    return None if target[0] == "--no-python" else target


def container_args(profile: ClusterProfile, job: JobSpec) -> tuple[list[str], list[str]]:
    """(extra srun flags, a command prefix) that run each task inside the profile's container."""
    c = profile.container
    if c is None:
        return [], []
    if job.launcher == "deepspeed":
        raise HpcError(f"the {c.runtime} container cannot be combined with the {job.launcher} launcher",
                       fix="use the srun or torchrun launcher, or drop 'container' from the profile")
    if c.runtime == "pyxis":
        flags = [f"--container-image={c.image}"]
        if c.mounts:
            flags.append("--container-mounts=" + ",".join(c.mounts))
        return flags + list(c.options), []
    wrap = ["apptainer", "exec"] + (["--nv"] if job.gpus_per_node else [])
    for m in c.mounts:
        wrap += ["--bind", m]
    return [], wrap + list(c.options) + [c.image]


def job_environment(job: JobSpec, profile: ClusterProfile) -> dict[str, str]:
    """What every process gets exported, lowest first: the variables `accelerate launch` would have set for
    this job's settings, then the profile's env, then the job's."""
    from hpc.contract.accelerate_env import to_environ
    from hpc.contract.training import training_values

    env = to_environ({**training_values(job), "mixed_precision": job.mixed_precision,
                                          "gradient_accumulation_steps": job.gradient_accumulation_steps})
    if job.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = job.gpu_ids
    return {**env, **profile.env, **job.env}


def _hostfile(job: JobSpec, profile: ClusterProfile, backend) -> str | None:
    """Rendered now when the hosts are known (a --nodelist, or this machine); otherwise the job writes it."""
    hosts = backend.known_hosts(job)
    if hosts is None:
        return None
    return layout.hostfile_text(hosts, job.nproc_per_node, profile.hostfile_format)


def rdzv_conf(job: JobSpec) -> str:
    """An elastic torchrun job's rendezvous settings, as they join ``is_host=`` in the node's PET_RDZV_CONF
    (torchrun's --rdzv_conf: ``key=value`` pairs, comma-separated; torch reads each with int()). Empty for a job
    that is not elastic: all of its nodes, or none, go on, so torch's own timeouts never hold it up."""
    if not job.elastic:
        return ""
    pairs = {"join_timeout": job.rdzv_join_timeout, "last_call_timeout": job.rdzv_last_call_timeout,
             "keep_alive_interval": job.rdzv_keep_alive_interval,
             "keep_alive_max_attempt": job.rdzv_keep_alive_max_attempt}
    # validated positive integers; int() again because the text lands inside the node's single-quoted bash -c
    return "".join(f",{key}={int(value)}" for key, value in pairs.items())


def vets(job, profile, backend) -> bool:
    """Whether the job's nodes are vetted before its ranks start: SLURM jobs only (the local profile has one
    machine); the job's `vet`, else the profile's vetting.enabled, else: 2+ nodes, spare nodes or a health check."""
    if backend.name != "slurm":
        return False
    if job.vet is not None:
        return job.vet
    if profile.vetting.enabled is not None:
        return profile.vetting.enabled
    return job.nodes + job.spare_nodes >= 2 or bool(profile.health_check)


def _check_spares(job, profile, backend, vetted: bool) -> None:
    if not job.spare_nodes:
        return
    if backend.name != "slurm":
        raise HpcError(f"spare_nodes = {job.spare_nodes} on the {profile.name} profile: only a SLURM job allocates "
                       "nodes to choose from", fix="drop --spare-nodes, or submit to a SLURM profile")
    if not vetted:
        raise HpcError(f"spare_nodes = {job.spare_nodes} with vetting off: nothing would choose the nodes to run on",
                       fix="drop --spare-nodes, or turn vetting on (--vet, or the profile's vetting.enabled)")
    # the spares are hot with --elastic (their agents wait in the rendezvous) and with the srun launcher (they wait
    # allocated, and a lost node's place goes to one: the step runs again); else vetting picks the best N of N+K


def _check_min_nodes(job, profile, backend) -> None:
    if job.min_nodes and backend.name != "slurm":
        raise HpcError(f"min_nodes = {job.min_nodes} on the {profile.name} profile: only a SLURM job is requeued onto "
                       "fewer nodes", fix="drop --min-nodes, or submit to a SLURM profile")


def node_range(job: JobSpec) -> tuple[int, int] | None:
    """(fewest, most) nodes the job can run on, where it is not exactly `nodes`: spare nodes (N to N+K), elastic
    (MIN to MAX), min_nodes (MIN to N, once fewer than N nodes are left to it)."""
    if job.min_nodes:
        return job.min_nodes, job.nodes
    if job.spare_nodes:
        return job.nodes, job.nodes + job.spare_nodes
    if job.elastic_range:
        return job.elastic_range
    return None


def render(effective: Effective, job_dir: str | Path, workdir: str | Path | None = None,
           *, backend) -> RenderedJob:
    """``workdir``: where the job runs (the code snapshot); None leaves it to sbatch (the submit folder)."""
    from hpc.contract import runtime_config

    job, profile = effective.job, effective.profile
    job_dir = str(Path(job_dir).absolute())
    if any(c.isspace() or c in "'\"$`\\;" for c in job_dir):
        raise HpcError(f"job folder {job_dir!r} holds whitespace or shell characters",
                       fix="set output_dir (or -o) to a path without them")
    sweep = sweeps.load(job.sweep) if job.sweep else []
    backend.check(job, profile, len(sweep))
    array_spec = f"0-{len(sweep) - 1}" if sweep else job.array
    env = _environment()
    name = template_name(job, backend)
    try:
        template = env.get_template(name)
    except jinja2.TemplateNotFound:
        known = sorted(t for t in env.list_templates() if t.endswith(".j2") and not t.startswith("_"))
        raise HpcError(f"no job template named {name!r}",
                       fix=f"use one of {', '.join(known)}, or put {name} in ./job_templates") from None
    vetted = vets(job, profile, backend)
    _check_spares(job, profile, backend, vetted)
    _check_min_nodes(job, profile, backend)
    mesh_sizes.check(job_environment(job, profile), job.nodes, job.nproc_per_node, job.elastic, job.min_nodes)
    hostfile = _hostfile(job, profile, backend)
    dirs = backend.directives(job, profile, job_dir, array_spec)
    srun_flags, wrap = container_args(profile, job)
    if job.cpu_bind:
        srun_flags = [*srun_flags, f"--cpu-bind={job.cpu_bind}"]
    signals = [profile.preemption.signal] + [s for s in ("TERM", "INT") if s != profile.preemption.signal]
    folder = layout.JobFolder("$HPC_JOB_DIR")  # the job's own view: bash expands the root and the task
    context = {
        "job": job,
        "python": python(profile),
        "env_vars": job_environment(job, profile),
        # each process's OMP_NUM_THREADS when the job says it; otherwise the script shares the node's CPUs
        "omp_threads": job.cpu_threads_per_process or job.cpus_per_task,
        "srun_flags": srun_flags,
        "wrap": wrap,
        "launcher_target": launcher_target(job),
        "nnodes": job.elastic or job.nodes,
        "forward_signals": signals,
        # an ignored signal stays ignored across exec, and a handler installed later still wins
        "ignore_early_signal": (f'trap "" {profile.preemption.signal}; '
                                if profile.preemption.signal not in ("TERM", "INT") else ""),
        "hostfile_slots_suffix": layout.hostfile_suffix(job.nproc_per_node, profile.hostfile_format),
        "profile": profile,
        "job_dir": job_dir,
        "workdir": str(workdir) if workdir else None,
        "directives": dirs,
        "target": target_argv(job, profile),
        "warm_target": warm_target(job, wrap),
        "sweep": [sweeps.as_args(t) for t in sweep],
        "hostfile_rendered": hostfile is not None,
        "runtime_config_env": layout.RUNTIME_CONFIG_ENV,
        "runtime_config_file": layout.RUNTIME_CONFIG,
        "world_size": job.nodes * job.nproc_per_node,
        "container": profile.container,
        "folder": folder,
        "hostfile_name": layout.HOSTFILE,
        **backend.template_context(),
        "TaskFile": layout.TaskFile,
        "port_of": layout.port_formula,
        # The task's shell outlives a TERM (trapped, so the program still gets the default) to note how the
        # program ended: a node that dies notes nothing, which is how the batch script tells it is lost.
        "run_and_note_end": ('trap : TERM INT; "$@"; rc=$?; echo "$rc" > '
                             f'"{folder.task("$HPC_TASK", layout.TaskFile.END)}.$SLURMD_NODENAME.$SLURM_PROCID"; '
                             'exit "$rc"'),
        "vet": vetted,
        "step_by_runner": False,  # deepspeed.sbatch.j2 says True: its runner starts the step on the hostfile's nodes
        "vet_port": layout.next_port_formula("MASTER_PORT"),
        # the nodes a requeue that excludes some asks for, (fewest, most); None: exactly the job's nodes
        "node_range": node_range(job),
        "fewest_nodes": node_range(job)[0] if node_range(job) else job.nodes,
        # min_nodes: an attempt runs on the nodes SLURM gave it ($nnodes), MIN to N; None: exactly the job's
        "min_nodes": job.min_nodes,
        "lost_node_after": profile.lost_nodes.after,
        "probe_timeout": profile.lost_nodes.probe_timeout,
        "hot_plain": job.replaces_lost_nodes,
        # the tasks each node of the step runs, where each notes its end (srun's: one a rank): once every node that
        # noted an end noted all of them, the step's other nodes are probed at once, not after lost_nodes.after
        "tasks_per_node": job.ntasks_per_node if job.launcher == "srun" and not job.elastic else None,
        "rdzv_conf": rdzv_conf(job),
    }
    try:
        script = template.render(**context).rstrip("\n") + "\n"
    except jinja2.sandbox.SecurityError as e:
        raise HpcError(f"job template {template.filename}: the sandbox refused it ({e})",
                       fix="a template gets values to print, not Python to run: remove that expression") from None
    config = runtime_config.from_effective(effective, backend.warns_before_limit).as_dict()
    return RenderedJob(script=script, script_name=backend.script_name, template=name, hostfile=hostfile,
                         runtime_config=config, effective=effective, directives=dirs,
                         array=array_indices(array_spec) if array_spec else None)
