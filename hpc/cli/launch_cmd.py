"""`hpc launch`: the in-task entry point; `accelerate launch`'s flags and config files work here too.

  * in an srun task (or under any launcher that set RANK/WORLD_SIZE): fill the standard variables, exec;
  * in a one-task-per-node srun step with more than one process per node (`--launcher torchrun`, or
    Accelerate's `--num_processes` over `--num_machines`): exec torchrun for this node (c10d rendezvous on the
    first host; elastic with --elastic MIN:MAX);
  * outside SLURM: `--nproc N` (or `--num_processes N`) starts N local processes, as `hpc submit --profile local`
    runs them; `--num_machines M --machine_rank R --main_process_ip IP` starts this machine's share of a
    job spread over M machines by hand, as `accelerate launch` does.

Accelerate's training settings (precision, FSDP, DeepSpeed, ...) reach the processes as the ACCELERATE_*
variables `accelerate launch` exports, which the Accelerator reads.
"""

from __future__ import annotations

import os
import sys
import tempfile

import click

from hpc.cli import accelerate_flags
from hpc.errors import HpcError, shown


def _python_target(module: bool, no_python: bool, target: str, args: tuple[str, ...]) -> list[str]:
    if module:
        return [sys.executable, "-m", target, *args]
    if no_python or not target.endswith(".py"):
        return [target, *args]
    return [sys.executable, target, *args]


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--nproc", "--nproc-per-node", "--nproc_per_node", "nproc", type=int,
              help="Processes per node (outside SLURM: local processes).")
@click.option("--launcher", type=click.Choice(["srun", "torchrun"]), help="How this node's processes start.")
@click.option("--elastic", metavar="MIN:MAX", help="Elastic torchrun between MIN and MAX nodes.")
@click.option("-m", "--module", "as_module", is_flag=True, help="TARGET is a module (python -m).")
@click.option("-q", "quiet_short", is_flag=True, hidden=True)
@accelerate_flags.options()
@click.argument("target")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def launch(nproc, launcher, elastic, as_module, quiet_short, target, args, **accelerate):
    """Start TARGET with its rank and rendezvous set up, whatever started this process.

    `accelerate launch`'s flags are accepted, spelled with underscores or dashes (--num_processes counts the
    processes of all machines, as Accelerate's does), and so are its config files (--config_file, or
    Accelerate's default file). Everything after TARGET is TARGET's own.

    \b
    Examples:
      hpc launch --nproc 2 train.py --lr 3e-4           # two local processes
      hpc launch --num_processes 2 --mixed_precision bf16 train.py
      srun hpc launch train.py                          # in your own sbatch script
      srun --ntasks-per-node=1 hpc launch --launcher torchrun --nproc 4 train.py
      srun --ntasks-per-node=1 hpc launch --num_processes 8 --num_machines 2 --main_process_ip "$head" train.py
    """
    from hpc.cli import launch_plan
    from hpc.contract import checks, runtime_config
    from hpc.contract import launch_env as hpc_env

    given = accelerate_flags.pop(accelerate)
    no_python = bool(given.pop("no_python", False))
    given.pop("quiet", None)  # hpc launch execs: no launcher traceback of its own to hide
    request = launch_plan.read_settings(given)
    config = runtime_config.current()
    max_restarts = request.values.get("max_restarts", config.get("max_restarts", 0))
    elastic = elastic or config.get("elastic")
    if elastic:
        try:
            checks.elastic(elastic)
        except HpcError as e:
            raise HpcError(f"--elastic {shown(elastic)} {e.problem}", fix=e.fix) from None
    machines = request.values.get("nodes")
    total = request.values.get("num_processes")
    if nproc is None and total:
        if total % (machines or 1):
            raise HpcError(f"--num_processes {total} does not divide over {machines} machines",
                           fix="give a multiple of --num_machines")
        nproc = total // (machines or 1)
    asked = nproc  # by the command line or a config file, not by the job this may run in
    if asked is not None:
        try:
            checks.local_processes(asked)
        except HpcError as e:
            raise HpcError(f"--nproc {asked} {e.problem}", fix=e.fix) from None
    nproc = nproc or config.get("nproc_per_node")
    launcher = launcher or config.get("launcher") or "srun"
    os.environ.update(request.environ)
    if launch_plan.is_main_launcher():
        for note in request.notes:
            click.echo(f"hpc: note: {note}", err=True)

    in_slurm_step = "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ
    started = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if started and not in_slurm_step and asked and asked > 1:
        started = _launched_already(asked)
    if in_slurm_step and not started:
        node = hpc_env.detect()
        agent_per_node = launch_plan.one_task_per_node(os.environ)
        launch_plan.check_against_slurm(request.expected, node, nproc if agent_per_node else None)
        if launcher == "torchrun" or (agent_per_node and (nproc or 1) > 1):
            # a store of the workers' own each round (see job_templates/torchrun.sbatch.j2)
            os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
            port = request.values.get("main_process_port") or node.master_port
            _exec(launch_plan.torchrun_argv(
                nnodes=elastic or str(node.num_nodes), nproc=nproc or 1, endpoint=f"{node.master_addr}:{port}",
                run_id=node.job_id or "hpc", max_restarts=max_restarts, extra=request.torchrun_flags,
                target=launch_plan.torchrun_target(as_module, no_python, target, args)))
    if not in_slurm_step and not started and (machines or 1) > 1:
        _exec(launch_plan.machines_argv(request, machines, nproc or 1, max_restarts,
                                        launch_plan.torchrun_target(as_module, no_python, target, args)))
    if nproc and nproc > 1 and not in_slurm_step and not started:
        _exec(_local_processes(nproc, as_module, no_python, target, args, request.values))
    hpc_env.export(hpc_env.detect())
    _exec(_python_target(as_module, no_python, target, args))


def _launched_already(asked: int) -> bool:
    """RANK and WORLD_SIZE are set and the command line asks for `asked` processes. A world of one is what a
    single-process run leaves in a shell (a notebook, an Accelerator built in this interpreter's parent):
    not a launch, so its variables go and the processes start. A launcher's ranks must agree with the ask."""
    world = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE")
    from hpc.contract.launch_env import STANDARD_VARIABLES

    if os.environ.get("WORLD_SIZE") == "1":
        for key in STANDARD_VARIABLES:
            os.environ.pop(key, None)
        return False
    if world != str(asked):
        raise HpcError(f"this process is already rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} (RANK and "
                       f"WORLD_SIZE are set) and the command line asks for {asked} processes",
                       fix="unset RANK and WORLD_SIZE to start the processes here, or drop --nproc/--num_processes "
                           "under a launcher that starts them")
    return True


def _local_processes(nproc, as_module, no_python, target, args, values) -> list[str]:
    """Render the local profile's job for N processes and run it: one mechanism for local ranks."""
    from hpc.cluster import backends
    from hpc.cluster.config import precedence

    key = "module" if as_module else ("script" if target.endswith(".py") and not no_python else "command")
    flags = {key: [target] if key == "command" else target, "args": list(args), "nproc_per_node": nproc}
    for name in ("main_process_port", "cpu_threads_per_process", "gpu_ids", "max_restarts", "monitor_interval"):
        if values.get(name) is not None:
            flags[name] = values[name]
    if values.get("max_restarts") or values.get("monitor_interval") is not None:
        flags["launcher"] = "torchrun"  # restarts and their monitoring are torchrun's agent's
    effective = precedence.resolve("local", [precedence.flag_layer(flags)])
    job_dir = tempfile.mkdtemp(prefix="hpc-launch-")
    os.environ["HPC_THROWAWAY_JOB_DIR"] = job_dir  # the job script removes it as it ends
    plan = backends.for_profile(effective.profile).plan(effective, job_dir, workdir=os.getcwd())
    plan.materialize()
    return plan.command


def _exec(argv: list[str]):
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        raise HpcError(f"cannot start {argv[0]}: {e.strerror}", fix="check the program and its path") from None
