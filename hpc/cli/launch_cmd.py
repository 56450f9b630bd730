"""`hpc launch`: the in-task entry point, like `accelerate launch`.

  * in an srun task (or under any launcher that set RANK/WORLD_SIZE): fill the standard variables, exec;
  * `--launcher torchrun` in a one-task-per-node srun step: exec torchrun for this node (c10d rendezvous
    on the first host; elastic with --elastic MIN:MAX);
  * `--nproc N` outside SLURM: N local processes, as `hpc submit --profile local` runs them.
"""

from __future__ import annotations

import os
import sys
import tempfile

import click

from hpc.errors import HpcError


def _python_target(module: bool, target: str, args: tuple[str, ...]) -> list[str]:
    if module:
        return [sys.executable, "-m", target, *args]
    return [sys.executable, target, *args] if target.endswith(".py") else [target, *args]


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--nproc", "--nproc-per-node", "nproc", type=int, help="Processes per node (outside SLURM: local processes).")
@click.option("--launcher", type=click.Choice(["srun", "torchrun"]), help="How this node's processes start.")
@click.option("--elastic", metavar="MIN:MAX", help="Elastic torchrun between MIN and MAX nodes.")
@click.option("--max-restarts", type=int, help="torchrun restarts of the worker group.")
@click.option("-m", "--module", "as_module", is_flag=True, help="TARGET is a module (python -m).")
@click.argument("target")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def launch(nproc, launcher, elastic, max_restarts, as_module, target, args):
    """Start TARGET with its rank and rendezvous set up, whatever started this process.

    \b
    Examples:
      hpc launch --nproc 2 train.py --lr 3e-4           # two local processes
      srun hpc launch train.py                          # in your own sbatch script
      srun --ntasks-per-node=1 hpc launch --launcher torchrun --nproc 4 train.py
    """
    from hpc import env as hpc_env
    from hpc.config import checks

    from hpc import runtime_config

    config = runtime_config.current()
    launcher = launcher or config.get("launcher") or "srun"
    nproc = nproc or config.get("nproc_per_node")
    elastic = elastic or config.get("elastic")
    max_restarts = max_restarts if max_restarts is not None else config.get("max_restarts", 0)
    if elastic:
        checks.elastic(elastic)
    in_slurm_step = "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ
    started = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if launcher == "torchrun" and in_slurm_step and not started:
        # a store of the workers' own each round (see job_templates/torchrun.sbatch.j2)
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        _exec(_torchrun_argv(hpc_env.detect(), nproc or 1, elastic, max_restarts, as_module, target, args))
    if nproc and nproc > 1 and not in_slurm_step and not started:
        _exec(_local_processes(nproc, as_module, target, args))
    hpc_env.export(hpc_env.detect())
    _exec(_python_target(as_module, target, args))


def _torchrun_argv(node, nproc, elastic, max_restarts, as_module, target, args) -> list[str]:
    """One agent per node: node.world_size counts the agents (one srun task per node)."""
    nnodes = elastic or str(node.num_nodes)
    argv = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint={node.master_addr}:{node.master_port}",
            f"--rdzv_id={node.job_id or 'hpc'}", f"--max_restarts={max_restarts}"]
    if as_module:
        return [*argv, "--module", target, *args]
    return [*argv, *([] if target.endswith(".py") else ["--no-python"]), target, *args]


def _local_processes(nproc, as_module, target, args) -> list[str]:
    """Render the local profile's job for N processes and run it: one mechanism for local ranks."""
    from hpc import backends
    from hpc.config import precedence

    key = "module" if as_module else ("script" if target.endswith(".py") else "command")
    flags = {key: [target] if key == "command" else target, "args": list(args), "nproc_per_node": nproc}
    effective = precedence.resolve("local", [precedence.flag_layer(flags)])
    job_dir = tempfile.mkdtemp(prefix="hpc-launch-")
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
