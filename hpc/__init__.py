"""hpc: from one machine to a multi-node SLURM cluster.

Importing this package must stay cheap and torch-free: the login-node CLI imports it.
Public names load on first use.
"""

HPC_VERSION = "0.1.0"  # pyproject.toml's version (tests/unit/test_script_checkpoints.py checks they agree)
ACCELERATE_API_VERSION = "1.15.0"
# Scripts written for Accelerate gate features on its version (diffusers registers its save/load hooks only when
# `accelerate.__version__ >= 0.16.0`), and with `import hpc as accelerate` they read this one: the Accelerate API
# level hpc implements, with hpc's own release as the local label ("1.15.0+hpc.0.1.0" compares as 1.15.0).
__version__ = f"{ACCELERATE_API_VERSION}+hpc.{HPC_VERSION}"

_LAZY = {"Accelerator": ("hpc.runtime", "Accelerator"), "set_seed": ("hpc.runtime", "set_seed"),
         "DistributedDataParallelKwargs": ("hpc.runtime", "DistributedDataParallelKwargs"),
         "GradScalerKwargs": ("hpc.runtime", "GradScalerKwargs"),
         "FullyShardedDataParallelPlugin": ("hpc.runtime.plugins", "FullyShardedDataParallelPlugin"),
         "DeepSpeedPlugin": ("hpc.runtime.plugins", "DeepSpeedPlugin"),
         "submit": ("hpc.api", "submit"), "Job": ("hpc.api", "Job"), "FunctionJob": ("hpc.api", "FunctionJob"),
         "HpcError": ("hpc.errors", "HpcError")}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'hpc' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])

# Accelerate's other top-level names (`from accelerate import X`); set_seed now takes its keywords too
_LAZY.update({"PartialState": ("hpc.runtime.process_state", "PartialState"),
              "DistributedType": ("hpc.runtime.distributed_type", "DistributedType"),
              "DataLoaderConfiguration": ("hpc.runtime.distributed_type", "DataLoaderConfiguration"),
              "find_executable_batch_size": ("hpc.runtime.batch_memory", "find_executable_batch_size"),
              "synchronize_rng_states": ("hpc.runtime.random_states", "synchronize_rng_states"),
              "skip_first_batches": ("hpc.runtime.data.loader", "skip_first_batches"),
              "set_seed": ("hpc.runtime.random_states", "set_seed"),
              "notebook_launcher": ("hpc.runtime.notebook_launcher", "notebook_launcher"),
              "debug_launcher": ("hpc.runtime.notebook_launcher", "debug_launcher"),
              **{name: ("hpc.runtime.distributed_type", name) for name in (
                  "AutocastKwargs", "InitProcessGroupKwargs", "ProfileKwargs", "DDPCommunicationHookType",
                  "GradientAccumulationPlugin", "ProjectConfiguration")}})

# Accelerate's big-model inference names (`from accelerate import init_empty_weights`, ...)
_LAZY.update({name: ("hpc.big_modeling", name) for name in (
    "init_empty_weights", "init_on_device", "load_checkpoint_and_dispatch", "dispatch_model", "cpu_offload",
    "cpu_offload_with_hook", "disk_offload", "infer_auto_device_map", "load_checkpoint_in_model")})

# hpc's batch-inference jobs (`from hpc import BatchInference`)
_LAZY.update({"BatchInference": ("hpc.inference", "BatchInference"), "read_outputs": ("hpc.inference", "read_outputs")})
# Accelerate's pipeline inference (`from accelerate import prepare_pippy`)
_LAZY.update({"prepare_pippy": ("hpc.inference", "prepare_pippy")})
# Accelerate's N-D parallelism (`from accelerate import ParallelismConfig`)
_LAZY.update({"ParallelismConfig": ("hpc.runtime.parallelism", "ParallelismConfig")})
