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

# Every public name of the package, by the module that holds it: one table, each name once. The paths are the
# public ones (Accelerate's module paths and hpc's), so `hpc.X is hpc.utils.X` wherever both exist.
_MODULES = {
    "hpc.accelerator": ["Accelerator"],
    "hpc.state": ["PartialState"],
    "hpc.utils.dataclasses": ["DataLoaderConfiguration", "DistributedType", "AutocastKwargs",
                              "DDPCommunicationHookType", "DeepSpeedPlugin", "DistributedDataParallelKwargs",
                              "FullyShardedDataParallelPlugin", "GradientAccumulationPlugin", "GradScalerKwargs",
                              "InitProcessGroupKwargs", "ProfileKwargs", "ProjectConfiguration"],
    "hpc.utils.random": ["set_seed", "synchronize_rng_states"],  # set_seed takes Accelerate's keywords too
    "hpc.utils.memory": ["find_executable_batch_size"],
    "hpc.data_loader": ["skip_first_batches"],
    "hpc.launchers": ["notebook_launcher", "debug_launcher"],
    "hpc.parallelism_config": ["ParallelismConfig"],
    "hpc.big_modeling": ["init_empty_weights", "init_on_device", "load_checkpoint_and_dispatch", "dispatch_model",
                         "cpu_offload", "cpu_offload_with_hook", "disk_offload", "infer_auto_device_map",
                         "load_checkpoint_in_model"],
    "hpc.inference": ["BatchInference", "read_outputs", "prepare_pippy"],
    "hpc.api": ["submit", "Job", "FunctionJob"],
    "hpc.errors": ["HpcError"],
    "hpc.utils": ["is_rich_available"],
}
_LAZY = {name: (module, name) for module, names in _MODULES.items() for name in names}


def __getattr__(name):
    if name == "rich":  # Accelerate's `accelerate.rich`: rich's tracebacks, installed when first asked for
        import importlib

        return importlib.import_module("hpc.utils.rich")
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'hpc' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY, "rich"])

