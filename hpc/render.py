"""Render a job into the text SLURM (or this machine) runs: the batch script, a hostfile, the runtime config.

``render()`` is the one code path behind ``hpc render``, ``hpc submit --dry-run`` and ``hpc submit``:
what a dry run shows is byte for byte what gets submitted.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from hpc import sweep as sweeps
from hpc.config.precedence import Effective
from hpc.config.schema import ClusterProfile, JobSpec
from hpc.config.training import training_values
from hpc.config.validate import to_plain
from hpc.errors import HpcError
from hpc.resources import search_path, user_cache_dir
from hpc.slurm import formats, hostlist

RUNTIME_CONFIG_ENV = "HPC_RUNTIME_CONFIG"
SCRIPT_NAME = {"slurm": "job.sbatch", "local": "job.sh"}


@dataclass(frozen=True)
class SbatchRequest:
    """Everything a submission needs; ``materialize`` writes it into the job folder."""

    script: str
    script_name: str
    template: str
    hostfile: str | None
    runtime_config: dict
    effective: Effective
    directives: list[str] = field(default_factory=list)

    def files(self) -> dict[str, str]:
        out = {self.script_name: self.script, "runtime.json": json.dumps(self.runtime_config, indent=2) + "\n"}
        if self.hostfile is not None:
            out["hostfile"] = self.hostfile
        return out

    def materialize(self, job_dir: str | Path) -> list[Path]:
        """Write the files; never over an existing one (a job folder is a record, not a scratch pad)."""
        job_dir = Path(job_dir)
        job_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, text in self.files().items():
            target = job_dir / name
            if target.exists():
                raise HpcError(f"{target} already exists", fix="choose another output folder, or remove it first")
            tmp = target.with_name(f".{name}.tmp{os.getpid()}")
            tmp.write_text(text)
            if name == self.script_name:
                tmp.chmod(0o755)
            os.replace(tmp, target)
            written.append(target)
        return written


def shell_quote(value) -> str:
    return shlex.quote(str(value))


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates, keyed by their source's checksum: compiling them is most of a render's time."""
    directory = user_cache_dir() / "jinja"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # a read-only home only costs speed
    return jinja2.FileSystemBytecodeCache(str(directory))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(p) for p in search_path("job_templates")]),
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
    return env


def template_name(job: JobSpec, profile: ClusterProfile) -> str:
    if job.template:
        return job.template if job.template.endswith(".j2") else f"{job.template}.j2"
    if profile.scheduler == "local":
        return "local.sh.j2"
    return f"{job.launcher}.sbatch.j2"


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


def launcher_target(job: JobSpec, launcher_flags: dict[str, str]) -> list[str]:
    """What torchrun or deepspeed is told to run; each spells 'module' and 'not python' its own way."""
    if job.module:
        return [launcher_flags["module"], job.module, *job.args]
    if job.script and job.script.endswith(".py"):
        return [job.script, *job.args]
    prog = [job.script] if job.script else list(job.command or [])
    return [launcher_flags["no_python"], *prog, *job.args]


_TORCHRUN_FLAGS = {"module": "--module", "no_python": "--no-python"}
_DEEPSPEED_FLAGS = {"module": "--module", "no_python": "--no_python"}


def container_args(profile: ClusterProfile, job: JobSpec) -> tuple[list[str], list[str]]:
    """(extra srun flags, a command prefix) that run each task inside the profile's container."""
    c = profile.container
    if c is None:
        return [], []
    if job.launcher == "deepspeed" or profile.scheduler == "local" and c.runtime == "pyxis":
        raise HpcError(f"the {c.runtime} container cannot be combined with the {job.launcher} launcher"
                       f"{' on a local profile' if profile.scheduler == 'local' else ''}",
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


def gpu_request(job: JobSpec, profile: ClusterProfile) -> tuple[str, str]:
    """(sbatch option, value) asking for the job's GPUs, as the profile's site spells it."""
    typed = f"{profile.gpu_type}:" if profile.gpu_type else ""
    if profile.gres_style == "gres":
        return "gres", f"gpu:{typed}{job.gpus_per_node}"
    return "gpus-per-node", f"{typed}{job.gpus_per_node}"


def dependency(job: JobSpec) -> str:
    """``--after 12:afterany --after 13`` -> ``afterany:12,afterok:13`` (checks.after wrote JOB:TYPE)."""
    return ",".join(f"{kind}:{jid}" for jid, kind in (a.split(":") for a in job.after))


def directives(job: JobSpec, profile: ClusterProfile, job_dir: str, n_sweep: int) -> list[str]:
    """The #SBATCH options, each already checked to be free of shell and whitespace characters."""
    d = [f"--job-name={job.job_name}", f"--nodes={job.nodes}", f"--ntasks-per-node={job.ntasks_per_node}"]
    if job.cpus_per_task:
        # cpus_per_task is per process; an agent (torchrun, deepspeed) task holds all of its node's processes
        per_task = job.cpus_per_task * (job.nproc_per_node if job.launcher != "srun" else 1)
        d.append(f"--cpus-per-task={per_task}")
    if job.gpus_per_node:
        key, value = gpu_request(job, profile)
        d.append(f"--{key}={value}")
    if job.mem:
        d.append(f"--mem={job.mem}")
    if job.mem_per_gpu:
        d.append(f"--mem-per-gpu={job.mem_per_gpu}")
    d.append(f"--time={formats.format_time(formats.parse_time(job.time))}")
    for key in ("partition", "account", "qos", "constraint", "reservation", "nodelist"):
        value = getattr(job, key)
        if value:
            d.append(f"--{key}={value}")
    array = f"0-{n_sweep - 1}" if n_sweep else job.array
    if array:
        d.append(f"--array={array}")
    if job.after:
        d.append(f"--dependency={dependency(job)}")
    if job.env_passthrough is not None:
        d.append("--export=" + (",".join(job.env_passthrough) or "NONE"))
    pattern = "%x-%A_%a" if array else "%x-%j"
    d.append(f"--output={job_dir}/logs/{pattern}.out")
    d.append("--open-mode=append")  # a requeued job appends to its log instead of truncating it
    pre = profile.preemption
    d.append(f"--signal=B:{pre.signal}@{pre.lead_time}")
    d.append("--requeue" if pre.requeue else "--no-requeue")
    d.extend(profile.sbatch_extra)
    return d


def _hostfile(job: JobSpec, profile: ClusterProfile, env: jinja2.Environment) -> str | None:
    """Rendered now when the hosts are known (a --nodelist, or this machine); otherwise the job writes it."""
    if profile.scheduler == "local":
        hosts = ["localhost"]
    elif job.nodelist:
        hosts = hostlist.expand(job.nodelist)
        if len(hosts) != job.nodes:
            raise HpcError(f"--nodelist {job.nodelist} names {len(hosts)} hosts but --nodes is {job.nodes}",
                           fix="make them agree")
    else:
        return None
    return env.get_template(f"hostfile.{profile.hostfile_format}.j2").render(hosts=hosts, slots=job.nproc_per_node)


# After a task fails, how long the other tasks get to end (srun's --kill-on-bad-exit kills them at once) before
# the nodes none of whose tasks ended are probed, and how long a probe (srun ... true) may take on a live node.
LOST_NODE_AFTER_S = 20
NODE_PROBE_TIMEOUT_S = 10


def runtime_config(effective: Effective) -> dict:
    """What the job's processes read back (contract 2): one file named by HPC_RUNTIME_CONFIG."""
    job, profile = effective.job, effective.profile
    return {
        "version": 1,
        "profile": profile.name,
        "scheduler": profile.scheduler,
        "job_name": job.job_name,
        "launcher": job.launcher,
        "nodes": job.nodes,
        "nproc_per_node": job.nproc_per_node,
        "elastic": job.elastic,
        "max_restarts": job.max_restarts,
        "preemption": to_plain(profile.preemption),
        "mixed_precision": job.mixed_precision,
        "gradient_accumulation_steps": job.gradient_accumulation_steps,
        "network_interface": profile.network_interface,
        **training_values(job),
    }


def render(effective: Effective, job_dir: str | Path, workdir: str | Path | None = None) -> SbatchRequest:
    """``workdir``: where the job runs (the code snapshot); None leaves it to sbatch (the submit folder)."""
    job, profile = effective.job, effective.profile
    job_dir = str(Path(job_dir).absolute())
    if any(c.isspace() or c in "'\"$`\\;" for c in job_dir):
        raise HpcError(f"job folder {job_dir!r} holds whitespace or shell characters",
                       fix="set output_dir (or -o) to a path without them")
    sweep = sweeps.load(job.sweep) if job.sweep else []
    if sweep and profile.scheduler == "local":
        raise HpcError("sweeps need a SLURM profile (each task is an array task)", fix="choose a SLURM --profile")
    env = _environment()
    name = template_name(job, profile)
    try:
        template = env.get_template(name)
    except jinja2.TemplateNotFound:
        known = sorted(t for t in env.list_templates() if t.endswith(".j2") and not t.startswith(("_", "hostfile.")))
        raise HpcError(f"no job template named {name!r}",
                       fix=f"use one of {', '.join(known)}, or put {name} in ./job_templates") from None
    hostfile = _hostfile(job, profile, env)
    dirs = directives(job, profile, job_dir, len(sweep)) if profile.scheduler == "slurm" else []
    srun_flags, wrap = container_args(profile, job)
    signals = [profile.preemption.signal] + [s for s in ("TERM", "INT") if s != profile.preemption.signal]
    context = {
        "job": job,
        "python": python(profile),
        "env_vars": {**profile.env, **job.env},
        "srun_flags": srun_flags,
        "wrap": wrap,
        "launcher_target": launcher_target(job, _DEEPSPEED_FLAGS if job.launcher == "deepspeed" else _TORCHRUN_FLAGS),
        "nnodes": job.elastic or job.nodes,
        "forward_signals": signals,
        # an ignored signal stays ignored across exec, and a handler installed later still wins
        "ignore_early_signal": (f'trap "" {profile.preemption.signal}; '
                                if profile.preemption.signal not in ("TERM", "INT") else ""),
        "hostfile_slots_suffix": f":{job.nproc_per_node}" if profile.hostfile_format == "mpi" else f" slots={job.nproc_per_node}",
        "profile": profile,
        "job_dir": job_dir,
        "workdir": str(workdir) if workdir else None,
        "directives": dirs,
        "target": target_argv(job, profile),
        "sweep": [sweeps.as_args(t) for t in sweep],
        "hostfile_rendered": hostfile is not None,
        "runtime_config_env": RUNTIME_CONFIG_ENV,
        "world_size": job.nodes * job.nproc_per_node,
        "container": profile.container,
        # The task's shell outlives a TERM (trapped, so the program still gets the default) to note how the
        # program ended: a node that dies notes nothing, which is how the batch script tells it is lost.
        "run_and_note_end": ('trap : TERM INT; "$@"; rc=$?; '
                             'echo "$rc" > "$HPC_JOB_DIR/tasks/$HPC_TASK.end.$SLURMD_NODENAME.$SLURM_PROCID"; exit "$rc"'),
        "lost_node_after": LOST_NODE_AFTER_S,
        "probe_timeout": NODE_PROBE_TIMEOUT_S,
    }
    script = template.render(**context).rstrip("\n") + "\n"
    return SbatchRequest(script=script, script_name=SCRIPT_NAME[profile.scheduler], template=name,
                         hostfile=hostfile, runtime_config=runtime_config(effective), effective=effective,
                         directives=dirs)
