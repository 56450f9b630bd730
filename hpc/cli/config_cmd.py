"""`hpc config`: the questions `accelerate config` asks, answered into an hpc job file; `hpc config default`;
`hpc config import FILE` (an Accelerate config file as an hpc job file).

The job file it writes by default is hpc's default job file (~/.config/hpc/job.yaml), read by every
`hpc submit`/`render` below --config_file, --config, HPC_* variables, --set and flags (`--explain` shows it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from hpc.contract.atomic import replacing
from hpc.errors import HpcError


@dataclass(frozen=True)
class Question:
    key: str  # the job key it answers
    prompt: str
    default: Any
    type: Any = str
    when: Callable[[dict], bool] = lambda answers: True  # asked only when earlier answers make it matter
    empty_is_none: bool = False


def _strategy(name: str) -> Callable[[dict], bool]:
    return lambda answers: answers.get("strategy") == name


def _yes_no(prompt: str, default: bool, when=lambda a: True, key="") -> Question:
    return Question(key, prompt, default, bool, when)


QUESTIONS = [
    Question("nodes", "How many nodes (machines) will the job use", 1, click.IntRange(1)),
    Question("nproc_per_node", "How many processes per node (0: one per GPU, or the profile's slots)", 0,
             click.IntRange(0)),
    Question("strategy", "How should the model be spread: none (one process or plain DDP), ddp, fsdp or deepspeed",
             "none", click.Choice(["none", "ddp", "fsdp", "deepspeed"])),
    Question("fsdp_sharding_strategy", "FSDP sharding", "FULL_SHARD",
             click.Choice(["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]),
             _strategy("fsdp")),
    Question("fsdp_auto_wrap_policy", "Which modules become FSDP units", "TRANSFORMER_AUTO_WRAP",
             click.Choice(["TRANSFORMER_AUTO_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]), _strategy("fsdp")),
    Question("fsdp_transformer_layer_cls_to_wrap", "The block class to wrap, comma-separated (e.g. BertLayer; "
             "empty: the model's _no_split_modules)", "",
             when=lambda a: a.get("fsdp_auto_wrap_policy") == "TRANSFORMER_AUTO_WRAP", empty_is_none=True),
    Question("fsdp_min_num_params", "Smallest module (parameters) that becomes a unit", 100_000_000, click.IntRange(1),
             lambda a: a.get("fsdp_auto_wrap_policy") == "SIZE_BASED_WRAP"),
    _yes_no("Offload parameters and gradients to the CPU", False, _strategy("fsdp"), "fsdp_cpu_offload"),
    _yes_no("Recompute activations in backward (activation checkpointing)", False, _strategy("fsdp"),
            "fsdp_activation_checkpointing"),
    Question("fsdp_state_dict_type", "Checkpoint format", "SHARDED_STATE_DICT",
             click.Choice(["SHARDED_STATE_DICT", "FULL_STATE_DICT"]), _strategy("fsdp")),
    _yes_no("Load pretrained weights on rank 0 only (transformers; saves CPU memory)", True, _strategy("fsdp"),
            "fsdp_cpu_ram_efficient_loading"),
    Question("deepspeed_config", "A DeepSpeed JSON config file (empty: none; hpc fills one from the answers)", "",
             when=_strategy("deepspeed"), empty_is_none=True),
    Question("zero_stage", "ZeRO stage", 2, click.IntRange(0, 3), lambda a: a.get("strategy") == "deepspeed"
             and not a.get("deepspeed_config")),
    _yes_no("Offload the optimizer state to the CPU", False,
            lambda a: a.get("strategy") == "deepspeed" and not a.get("deepspeed_config"), "offload_optimizer"),
    _yes_no("Offload the parameters to the CPU", False,
            lambda a: a.get("strategy") == "deepspeed" and a.get("zero_stage") == 3, "offload_param"),
    Question("gradient_clipping", "Clip gradients to this norm (0: no clipping)", 0.0, click.FloatRange(0),
             _strategy("deepspeed")),
    Question("mixed_precision", "Mixed precision", "no", click.Choice(["no", "bf16", "fp16", "fp8"])),
    Question("gradient_accumulation_steps", "Gradient accumulation steps", 1, click.IntRange(1)),
    Question("dynamo_backend", "torch.compile backend (no: not compiled; e.g. inductor)", "no"),
    Question("dynamo_mode", "torch.compile mode", "default",
             click.Choice(["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]),
             lambda a: a.get("dynamo_backend") not in (None, "no")),
    _yes_no("Resume from the newest checkpoint when the job starts again", True, key="auto_resume"),
]


def _options(fn):
    for q in reversed(QUESTIONS):
        spelled = "--" + q.key.replace("_", "-")
        tp = None if q.type is bool else q.type
        fn = click.option(spelled, q.key, type=tp or click.BOOL, default=None, help=q.prompt + ".")(fn)
    return fn


def _answers_to_job(answers: dict) -> dict:
    """Answers -> job keys, leaving out what says 'not set' (so profiles and flags still decide it)."""
    job: dict[str, Any] = {}
    for q in QUESTIONS:
        value = answers.get(q.key)
        if value is None or (q.empty_is_none and value == ""):
            continue
        job[q.key] = value
    if job.get("strategy") == "none":
        job.pop("strategy")
    for key, default in (("nodes", 1), ("mixed_precision", "no"), ("gradient_accumulation_steps", 1)):
        if job.get(key) == default:  # the built-in default: written, it would outrank a profile or --elastic
            job.pop(key)
    if job.get("nproc_per_node") == 0:
        job.pop("nproc_per_node")
    if job.get("dynamo_backend") == "no":
        job.pop("dynamo_backend")
    if job.get("gradient_clipping") == 0:
        job.pop("gradient_clipping")
    if isinstance(job.get("fsdp_transformer_layer_cls_to_wrap"), str):
        job["fsdp_transformer_layer_cls_to_wrap"] = [c.strip()
                                                     for c in job["fsdp_transformer_layer_cls_to_wrap"].split(",")
                                                     if c.strip()]
    return job


def _ask(given: dict, yes: bool) -> dict:
    answers: dict[str, Any] = {}
    for q in QUESTIONS:
        if not q.when(answers):
            continue
        if given.get(q.key) is not None:
            answers[q.key] = given[q.key]
        elif yes:
            answers[q.key] = q.default
        else:
            try:
                if q.type is bool:
                    answers[q.key] = click.confirm(q.prompt, default=q.default)
                else:
                    answers[q.key] = click.prompt(q.prompt, default=q.default, type=q.type, show_default=True)
            except click.Abort:
                raise HpcError(f"no answer for {q.key!r} on standard input",
                               fix=f"give --{q.key.replace('_', '-')}, or -y to take the defaults") from None
    return answers


def write_job_file(data: dict, target: Path, header: str) -> None:
    """Checked as a job file before it takes its name; never over an existing file."""
    import yaml

    from hpc.cluster.config import precedence
    from hpc.cluster.config.schema import JobSpec
    from hpc.contract.validate import check_field

    taken = HpcError(f"{target} already exists", fix="remove it first, or write elsewhere with -o; hpc never "
                     "overwrites a job file")
    if target.exists():  # before the folder is made or the content checked
        raise taken
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with replacing(target.absolute(), new=True) as tmp:  # checked before it takes the real name
            tmp.write_text(header + (yaml.safe_dump(data, sort_keys=False) if data else "{}\n"))
            for key, value in precedence.job_file_layer(tmp).values.items():  # unknown keys refused here
                check_field(JobSpec, key, value, str(target), key)
    except FileExistsError:  # made meanwhile
        raise taken from None


def _target(out: str | None) -> Path:
    from hpc.cluster.config import precedence

    return Path(out) if out else precedence.default_job_file()


@click.group(invoke_without_command=True)
@_options
@click.option("-o", "--out", type=click.Path(dir_okay=False),
              help="Where to write the job file [default: ~/.config/hpc/job.yaml, read by every submit].")
@click.option("--yes", "-y", is_flag=True, help="Take the default for every question not given as a flag.")
@click.pass_context
def config(ctx, out, yes, **given):
    """Answer what `accelerate config` asks (nodes, processes, FSDP or DeepSpeed and their settings, precision,
    accumulation, compile) and write an hpc job file. Every answer can be given as a flag.

    \b
    Examples:
      hpc config                                    # asks, writes ~/.config/hpc/job.yaml
      hpc config --strategy fsdp --mixed-precision bf16 -y -o fsdp-job.yaml
      hpc config default                            # the defaults, no questions
      hpc config import accelerate_fsdp.yaml -o fsdp-job.yaml
    """
    if ctx.invoked_subcommand is not None:
        return
    target = _target(out)
    job = _answers_to_job(_ask(given, yes))
    write_job_file(job, target, "# Written by `hpc config`; `hpc render --explain` shows where each value lands.\n")
    click.echo(f"wrote {target}")


@config.command()
@click.option("--mixed-precision", "--mixed_precision", type=click.Choice(["no", "bf16", "fp16", "fp8"]), default="no",
              show_default=True)
@click.option("-o", "--out", type=click.Path(dir_okay=False),
              help="Where to write it [default: ~/.config/hpc/job.yaml].")
def default(mixed_precision, out):
    """Write the default job file without questions, as `accelerate config default` does."""
    target = _target(out)
    write_job_file({"mixed_precision": mixed_precision}, target,
                   "# Written by `hpc config default`; add any job key (hpc render --explain lists them).\n")
    click.echo(f"wrote {target}")


@config.command("import")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("-o", "--out", type=click.Path(dir_okay=False), help="Write the job file here (default: print it).")
def import_(file, out):
    """Turn an Accelerate config file (YAML or JSON, as `accelerate config` writes it) into an hpc job file.

    What hpc honours its own way is said on stderr, one line each; what it cannot do is an error."""
    import yaml

    from hpc.cluster.config import accelerate_file

    translation = accelerate_file.translate(file)
    for note in translation.notes:
        click.echo(f"hpc: note: {note}", err=True)
    data = dict(translation.values)
    header = f"# Imported by `hpc config import` from {file}.\n"
    if out is None:
        click.echo(header + yaml.safe_dump(data, sort_keys=False), nl=False)
        return
    write_job_file(data, Path(out), header)
    click.echo(f"wrote {out}", err=True)
