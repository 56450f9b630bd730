"""The job flags shared by `hpc render` and `hpc submit`, named as sbatch names them."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click

from hpc.cli import accelerate_flags
from hpc.cluster.config import precedence
from hpc.cluster.config.precedence import Effective
from hpc.errors import shown

# (flag spellings, job key, click kwargs)
_FLAGS: list[tuple[tuple[str, ...], str, dict[str, Any]]] = [
    (("--nodes", "-N"), "nodes", {"type": int, "help": "Nodes to allocate."}),
    (("--ntasks-per-node",), "ntasks_per_node",
     {"type": int, "help": "SLURM tasks per node (default: one per GPU or slot; 1 for torchrun/deepspeed)."}),
    (("--nproc-per-node", "--nproc"), "nproc_per_node",
     {"type": int, "help": "Processes per node (default: GPUs per node, or the profile's slots)."}),
    (("--gpus-per-node",), "gpus_per_node", {"type": int, "help": "GPUs per node."}),
    (("--cpus-per-task", "-c"), "cpus_per_task", {"type": int, "help": "CPUs per process."}),
    (("--mem",), "mem", {"help": "Memory per node, e.g. 64G."}),
    (("--mem-per-gpu",), "mem_per_gpu", {"help": "Memory per GPU, e.g. 40G."}),
    (("--time", "-t"), "time", {"help": "Time limit in any sbatch spelling, e.g. 2-00:00:00."}),
    (("--partition",), "partition", {"help": "SLURM partition."}),
    (("--account", "-A"), "account", {"help": "Account to charge."}),
    (("--qos", "-q"), "qos", {"help": "Quality of service."}),
    (("--constraint", "-C"), "constraint", {"help": "Node features, e.g. gpu&hbm80g."}),
    (("--reservation",), "reservation", {"help": "Reservation name."}),
    (("--nodelist", "-w"), "nodelist", {"help": "Hosts to run on, e.g. node[01-04]."}),
    (("--job-name", "-J"), "job_name", {"help": "Job name (default: the script's name)."}),
    (("--launcher",), "launcher",
     {"type": click.Choice(["srun", "torchrun", "deepspeed"]), "help": "How ranks are started."}),
    (("--elastic",), "elastic", {"metavar": "MIN:MAX", "help": "Elastic torchrun between MIN and MAX nodes."}),
    (("--max-restarts", "--max_restarts"), "max_restarts",
     {"type": int, "help": "torchrun restarts of the worker group."}),
    (("--array", "-a"), "array", {"help": "Array spec, e.g. 0-99%8."}),
    (("--sweep",), "sweep",
     {"metavar": "FILE", "help": "Sweep file (grid or list): one array job, one task per entry."}),
    (("--after",), "after",
     {"multiple": True, "metavar": "JOB[:TYPE]",
      "help": "Start after JOB (afterok, or afterany/afternotok/...). Repeatable."}),
    (("--template",), "template", {"help": "Job template by name (./job_templates first)."}),
    (("--output-dir",), "output_dir", {"help": "Folder that holds job folders (default from the profile)."}),
    (("--mixed-precision", "--mixed_precision"), "mixed_precision",
     {"type": click.Choice(["no", "bf16", "fp16", "fp8"]), "help": "Accelerator's precision in the job."}),
    (("--gradient-accumulation-steps", "--gradient_accumulation_steps"), "gradient_accumulation_steps",
     {"type": int, "help": "Accelerator's accumulation in the job."}),
    (("--strategy",), "strategy",
     {"type": click.Choice(["ddp", "fsdp", "deepspeed"]),
      "help": "How Accelerator spreads the model (other fsdp_*/ZeRO keys: --set or a job file)."}),
    (("--zero-stage", "--zero_stage"), "zero_stage",
     {"type": click.IntRange(0, 3), "help": "DeepSpeed ZeRO stage (with --strategy deepspeed)."}),
    (("--fsdp-sharding-strategy", "--fsdp_sharding_strategy"), "fsdp_sharding_strategy",
     {"type": click.Choice(["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]),
      "help": "FSDP sharding (with --strategy fsdp)."}),
    (("--hang-timeout",), "hang_timeout",
     {"type": float, "metavar": "SECONDS",
      "help": "End (or with hang_requeue, requeue) a job whose ranks make no step for this long; 0: off [300]."}),
    (("--spare-nodes",), "spare_nodes",
     {"type": int, "metavar": "K", "help": "Allocate K nodes more; the job starts on the best of them after vetting."}),
    (("--min-nodes",), "min_nodes",
     {"type": int, "metavar": "MIN",
      "help": "A requeue that cannot get --nodes fit nodes (bad or lost ones excluded) runs on down to MIN nodes, "
              "resuming exactly, instead of ending FAILED."}),
    (("--notify",), "notify",
     {"metavar": "URL|EMAIL", "help": "Webhook or email told when the job starts, requeues, loses a node, ends."}),
    (("--module", "-m"), "module", {"help": "Run a Python module (python -m MODULE) instead of a script."}),
    (("--cpu-bind",), "cpu_bind", {"help": "srun --cpu-bind for every task, e.g. cores."}),
    (("--resume-args",), "resume_args",
     {"metavar": "ARGS", "callback": lambda ctx, param, value: _shell_words(value),
      "help": "A script that resumes itself: the arguments a requeued attempt gets, {checkpoint} standing for its "
              "newest verified checkpoint, e.g. '--resume_from_checkpoint {checkpoint}'."}),
]


def _shell_words(value: str | None) -> list[str] | None:
    import shlex

    try:
        return shlex.split(value) if value is not None else None
    except ValueError as e:
        raise click.BadParameter(f"{shown(value)}: {e}") from None


class JobCommand(click.Command):
    """A command taking job flags: `accelerate launch`'s flags come off the command line first (docs/launch.md lists
    them; --help shows only --config_file), then click parses the rest."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest, ctx.meta["hpc.accelerate"] = accelerate_flags.take(args,
                                                                 keep=accelerate_flags.SUBMIT_HAS | {"config_file"})
        return super().parse_args(ctx, rest)


def job_options(fn: Callable) -> Callable:
    """Add every job flag plus --profile/--config/--set and the TARGET [ARGS]... arguments. The command must be a
    JobCommand (`@click.command(cls=JobCommand)`), which takes `accelerate launch`'s flags too."""

    @click.option("--profile", "-p", "profile", envvar="HPC_PROFILE",
                  help="Cluster profile name or path [env: HPC_PROFILE; default: local].")
    @click.option("--config", "job_file", type=click.Path(dir_okay=False), help="Job file (YAML) with job keys.")
    @click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Set any job key. Repeatable.")
    @click.argument("target", required=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.option("--config_file", "--config-file", "config_file", help=accelerate_flags.CONFIG_FILE_HELP)
    @functools.wraps(fn)
    def wrapper(*a, config_file=None, **kw):
        flags = {key: kw.pop(key) for _, key, _ in _FLAGS}
        given = dict(click.get_current_context().meta.get("hpc.accelerate", {}))
        flags["accelerate"] = {**given, "config_file": config_file} if config_file else given
        return fn(*a, flags=flags, **kw)

    for spellings, key, extra in reversed(_FLAGS):
        wrapper = click.option(*spellings, key, default=None, **extra)(wrapper)
    return wrapper


def resolve(profile: str | None, job_file: str | None, assignments: tuple[str, ...],
            target: str | None, args: tuple[str, ...], flags: dict[str, Any]) -> Effective:
    """Flags and arguments -> the effective job (precedence applied, everything validated)."""
    flags = dict(flags)
    accelerate = dict(flags.pop("accelerate", None) or {})
    config_file = accelerate.pop("config_file", None)
    no_python = accelerate.get("no_python")
    flags["after"] = list(flags["after"]) or None
    args = list(args)
    if target is not None:
        if flags.get("module"):
            args.insert(0, target)  # `-m pkg.train x` : x is the module's first argument
        elif target.endswith(".py") and not no_python:
            flags["script"] = target
        else:
            flags["command"] = [target]
    if args:
        flags["args"] = args
    layers = precedence.default_layers(config_file)
    if job_file:
        layers.append(precedence.job_file_layer(job_file))
    layers.append(precedence.env_layer())
    if assignments:
        layers.append(precedence.set_layer(list(assignments)))
    if accelerate:
        from hpc.contract import accelerate_settings  # only a command line with Accelerate's flags pays for it

        translation = accelerate_settings.translate(accelerate, "command line", spell=lambda s: f"--{s}")
        layers.append(precedence.accelerate_layer(translation, "accelerate flag", "command line"))
    layers.append(precedence.flag_layer(flags))
    effective = precedence.resolve(profile, layers)
    for note in effective.notes:  # Accelerate settings hpc honours its own way: said once, on stderr
        click.echo(f"hpc: note: {note}", err=True)
    return effective
