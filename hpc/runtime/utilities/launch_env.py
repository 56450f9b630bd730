"""`accelerate.utils.launch`: the command and environment a launcher gives a training script, from the parsed
flags of `accelerate launch` (hpc.commands.launch.launch_command_parser parses the same). hpc's runtime reads the
ACCELERATE_* and FSDP_* variables written here, as Accelerate's does."""

from __future__ import annotations

import argparse
import os
import sys

import torch

from hpc.errors import HpcError
from hpc.runtime.process.distributed_type import DistributedType
from hpc.runtime.utilities.enums import DynamoBackend, PrecisionType


def _get(args, name, default=None):
    return getattr(args, name, default) if getattr(args, name, None) is not None else default


def _common_env(args: argparse.Namespace) -> dict[str, str]:
    env = os.environ.copy()
    env["ACCELERATE_USE_CPU"] = str(bool(_get(args, "cpu", False) or _get(args, "use_cpu", False)))
    if _get(args, "debug", False):
        env["ACCELERATE_DEBUG_MODE"] = "true"
    gpu_ids = _get(args, "gpu_ids")
    if gpu_ids not in (None, "all"):
        env["CUDA_VISIBLE_DEVICES"] = gpu_ids
    mixed = str(_get(args, "mixed_precision", "no")).lower()
    if mixed not in PrecisionType:
        raise ValueError(f"Unknown mixed_precision mode: {mixed}. Choose between {PrecisionType.list()}.")
    env["ACCELERATE_MIXED_PRECISION"] = mixed
    backend = str(_get(args, "dynamo_backend", "no")).upper()
    if backend not in DynamoBackend:
        raise ValueError(f"Unknown dynamo backend: {backend}. Choose between {DynamoBackend.list()}.")
    env["ACCELERATE_DYNAMO_BACKEND"] = backend
    env["ACCELERATE_DYNAMO_MODE"] = str(_get(args, "dynamo_mode", "default"))
    for flag in ("use_fullgraph", "use_dynamic", "use_regional_compilation"):
        env[f"ACCELERATE_DYNAMO_{flag.upper()}"] = str(bool(_get(args, f"dynamo_{flag}", False)))
    threads = _get(args, "num_cpu_threads_per_process")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if _get(args, "enable_cpu_affinity", False):
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    if _get(args, "gradient_accumulation_steps"):
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(args.gradient_accumulation_steps)
    return env


def _script_cmd(args: argparse.Namespace) -> list[str]:
    if _get(args, "no_python", False) and _get(args, "module", False):
        raise ValueError("--module and --no_python cannot be used together")
    cmd = [] if _get(args, "no_python", False) else [sys.executable, *(["-m"] if _get(args, "module", False) else [])]
    return [*cmd, args.training_script, *list(_get(args, "training_script_args", []))]


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """One process (or MPI's): ``python script args`` and the environment naming the job's settings."""
    env = _common_env(args)
    machines = int(_get(args, "num_machines", 1))
    processes = _get(args, "num_processes")
    if (processes is not None and processes > 1) or machines > 1:
        env["MASTER_ADDR"] = _get(args, "main_process_ip", "127.0.0.1")
        env["MASTER_PORT"] = str(_get(args, "main_process_port", 29500))
    return _script_cmd(args), env


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """The environment for torchrun's processes (data parallel, or FSDP with the FSDP_* settings); the rendezvous
    flags are set on ``args`` for torch.distributed.run, as Accelerate does."""
    env = _common_env(args)
    machines = int(_get(args, "num_machines", 1))
    args.nproc_per_node = str(int(_get(args, "num_processes", 1)) // machines)
    args.nnodes = str(machines)
    args.node_rank = int(_get(args, "machine_rank", 0))
    if machines > 1:
        args.master_addr = _get(args, "main_process_ip")
        args.master_port = str(_get(args, "main_process_port", 29500))
    else:
        args.master_port = str(_get(args, "main_process_port", 29500))
    if _get(args, "use_fsdp", False):
        env["ACCELERATE_USE_FSDP"] = "true"
        for name in ("sharding_strategy", "reshard_after_forward", "offload_params", "min_num_params",
                     "auto_wrap_policy", "transformer_layer_cls_to_wrap", "backward_prefetch", "state_dict_type",
                     "forward_prefetch", "use_orig_params", "cpu_ram_efficient_loading", "sync_module_states",
                     "activation_checkpointing", "version"):
            value = _get(args, f"fsdp_{name}")
            if value is not None:
                key = "TRANSFORMER_CLS_TO_WRAP" if name == "transformer_layer_cls_to_wrap" else name.upper()
                env[f"FSDP_{key}"] = str(value)
    return env


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """torchrun-style command (hpc starts DeepSpeed's ranks through torch.distributed) and the ACCELERATE_DEEPSPEED_*
    environment hpc's DeepSpeed strategy reads."""
    env = prepare_multi_gpu_env(args)
    env["ACCELERATE_USE_DEEPSPEED"] = "true"
    for name in ("zero_stage", "offload_optimizer_device", "offload_param_device", "zero3_init_flag",
                 "zero3_save_16bit_model", "deepspeed_config_file"):
        value = _get(args, name)
        if value is not None:
            key = {"zero3_init_flag": "ZERO3_INIT", "deepspeed_config_file": "CONFIG_FILE"}.get(name, name.upper())
            env[f"ACCELERATE_DEEPSPEED_{key}"] = str(value)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.nproc_per_node}",
           f"--nnodes={args.nnodes}", f"--node_rank={args.node_rank}", f"--master_port={args.master_port}",
           *([f"--master_addr={args.master_addr}"] if getattr(args, "master_addr", None) else []),
           *(["--module"] if _get(args, "module", False) else []),
           *(["--no_python"] if _get(args, "no_python", False) else []),
           args.training_script, *list(_get(args, "training_script_args", []))]
    return cmd, env


def prepare_tpu(args: argparse.Namespace, current_env: dict, pod: bool = False):
    raise HpcError("prepare_tpu: hpc does not run on TPUs (torch_xla is not one of its platforms)",
                   fix="launch on GPUs or CPUs with hpc launch")


def prepare_sagemager_args_inputs(sagemaker_config, args):
    raise HpcError("prepare_sagemager_args_inputs: hpc does not launch on Amazon SageMaker",
                   fix="submit to a SLURM cluster with hpc submit, or run hpc launch on the machine")


class PrepareForLaunch:
    """A function made ready to run as process ``index`` of a fork-started job (notebook_launcher's children):
    its rank variables set (or, in debug, a gloo group over a file store), then the function called."""

    def __init__(self, launcher, distributed_type="NO", debug: bool = False):
        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args):
        if self.debug:
            world_size = int(os.environ["WORLD_SIZE"])
            store = torch.distributed.FileStore(os.environ["ACCELERATE_DEBUG_RDV_FILE"], world_size)
            torch.distributed.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU, DistributedType.FSDP,
                                       DistributedType.DEEPSPEED):
            os.environ["LOCAL_RANK"] = str(index)
            nproc = int(os.environ.get("NPROC", 1))
            os.environ["RANK"] = str(nproc * int(os.environ.get("NODE_RANK", 0)) + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)
