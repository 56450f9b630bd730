"""ParallelismConfig: Accelerate's N-D parallelism, its names, defaults and checks.

One DeviceMesh over the job's ranks, its dimensions in Accelerate's canonical order (dp_replicate, dp_shard, cp,
tp) so that tp, the innermost, falls within a node: consecutive ranks share a node, and tensor parallelism's
all-reduces in every layer want the fastest links. Joint dimensions are flattened as Accelerate's are: "dp" (the
data-parallel ranks: distinct batches), "dp_shard_cp" (what FSDP shards over), "dp_cp" (what a loss is averaged
over). The order, the joint dimensions and which sizes compose are the contract's (hpc/contract/mesh_sizes.py),
read the same way at submit.

Sizes left unset come from PARALLELISM_CONFIG_<DIM>_SIZE (Accelerate's launcher sets them), else 1.

Every mesh hpc trains over is built here: the ParallelismConfig's, and the (replicate x shard) one an FSDP plugin's
sharding_strategy asks for without a ParallelismConfig (plugin_mesh).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpc.contract import mesh_sizes
from hpc.contract.mesh_sizes import DIMS
from hpc.errors import HpcError


@dataclass
class TorchTensorParallelConfig:
    """Accelerate's tensor-parallel handler. enable_async_tp overlaps TP's collectives with compute (CUDA only)."""

    enable_async_tp: bool = False


@dataclass
class TorchContextParallelConfig:
    """Accelerate's context-parallel handler (cp_size > 1). cp_comm_strategy: how torch's ring attention passes the
    keys and values around on CUDA ("allgather" or "alltoall"); PARALLELISM_CONFIG_CP_COMM_STRATEGY, else
    "allgather"."""

    cp_comm_strategy: str | None = None

    def __post_init__(self):
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = os.environ.get("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "allgather")
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise HpcError(f"cp_comm_strategy {self.cp_comm_strategy!r} is not one torch's context parallelism has",
                           fix="use 'allgather' or 'alltoall'")


@dataclass
class TorchTensorParallelPlugin:
    """Accelerate's older way to ask for tensor parallelism (`Accelerator(torch_tp_plugin=...)`): its tp_size
    becomes ParallelismConfig(tp_size=...). ``tp_plan`` (hpc's): a plan for a model that carries none of its own,
    `{"module.path.*.name": "colwise" | "rowwise" | ... or a torch ParallelStyle}`."""

    tp_size: int = 1
    torch_device_mesh: object = None
    tp_plan: dict | None = None


def _size(value, name: str) -> int:
    if value is None:
        value = mesh_sizes.parse(name, os.environ.get(mesh_sizes.variable(name), "1"))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise HpcError(f"ParallelismConfig({name}_size={value!r}) must be a whole number >= 1", fix="use 1 or more")
    return value


@dataclass
class ParallelismConfig:
    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None  # DeepSpeed's Ulysses sequence parallelism: accepted at 1 (settings.parallelism_of)
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: object = None

    device_mesh = None  # built once the job's ranks are known (build_device_mesh)
    shard_the_rest = False  # made from torch_tp_plugin: dp_shard takes the ranks tensor parallelism leaves

    def __post_init__(self):
        for name in (*DIMS, "sp"):
            setattr(self, f"{name}_size", _size(getattr(self, f"{name}_size"), name))
        if self.cp_backend is None:
            self.cp_backend = os.environ.get("PARALLELISM_CONFIG_CP_BACKEND", "torch")
        if self.cp_backend != "torch":
            raise HpcError(f"ParallelismConfig(cp_backend={self.cp_backend!r}): context parallelism runs on torch's",
                           fix="use cp_backend='torch'")
        if self.sp_backend is None:
            self.sp_backend = os.environ.get("PARALLELISM_CONFIG_SP_BACKEND", "deepspeed")
        if self.tp_size > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1 and self.cp_handler is None:
            self.cp_handler = TorchContextParallelConfig()
        if self.cp_handler is not None and not isinstance(self.cp_handler, TorchContextParallelConfig):
            raise HpcError(f"ParallelismConfig(cp_handler=...) is a {type(self.cp_handler).__name__}",
                           fix="give a TorchContextParallelConfig (from hpc.utils)")
        if self.cp_size > 1 and self.sp_size > 1:
            raise HpcError(f"ParallelismConfig: context parallelism (cp_size {self.cp_size}) and sequence "
                           f"parallelism (sp_size {self.sp_size}) each split the sequence; they cannot be composed",
                           fix="set one of them to 1")
        if mesh_sizes.tp_cp_over_pure_replicate(self.sizes()):
            raise HpcError("ParallelismConfig: tensor/context parallelism cannot be composed with pure data "
                           "parallelism (dp_replicate_size > 1, dp_shard_size 1)",
                           fix="set dp_shard_size > 1 (FSDP x TP), or dp_replicate_size and dp_shard_size both "
                               "> 1 (HSDP x TP)")

    # --- Accelerate's facts ---------------------------------------------------------------------------
    def _enabled(self, name: str) -> bool:
        return getattr(self, f"{name}_size") > 1

    dp_replicate_enabled = property(lambda self: self._enabled("dp_replicate"))
    dp_shard_enabled = property(lambda self: self._enabled("dp_shard"))
    tp_enabled = property(lambda self: self._enabled("tp"))
    cp_enabled = property(lambda self: self._enabled("cp"))

    def _split(self, dims) -> list[str]:
        return [d for d in dims if self._enabled(d)]

    dp_dim_names = property(lambda self: self._split(mesh_sizes.JOINT["dp"]))
    non_dp_dim_names = property(lambda self: self._split(mesh_sizes.NON_DATA))
    dp_shard_cp_dim_names = property(lambda self: self._split(mesh_sizes.JOINT["dp_shard_cp"]))
    dp_cp_dim_names = property(lambda self: self._split(mesh_sizes.JOINT["dp_cp"]))

    @property
    def fsdp_dim_names(self) -> list[str]:
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    @property
    def total_size(self) -> int:
        return mesh_sizes.total(self.sizes())

    @property
    def non_data_parallel_size(self) -> int:
        return self.tp_size * self.cp_size

    @property
    def data_parallel_size(self) -> int:
        return self.dp_replicate_size * self.dp_shard_size

    def sizes(self) -> dict[str, int]:
        return {name: getattr(self, f"{name}_size") for name in DIMS}

    def describe(self) -> str:
        return " x ".join(f"{name} {size}" for name, size in self.sizes().items() if size > 1) or "one rank"

    # --- the job ----------------------------------------------------------------------------------------
    def fit(self, world: int) -> None:
        """Check the sizes against the job's ranks; all left at 1 means plain data parallelism over them (as
        Accelerate's: dp_replicate takes the whole world)."""
        if self.shard_the_rest and world % self.total_size == 0:
            self.dp_shard_size = world // (self.dp_replicate_size * self.tp_size * self.cp_size)
        if self.total_size == 1 and world > 1:
            self.dp_replicate_size = world
        if self.total_size != world:
            raise HpcError(f"ParallelismConfig {self.describe()} needs {self.total_size} processes; the job has "
                           f"{world}", fix="make dp_replicate x dp_shard x cp x tp the job's number of processes")

    def build_device_mesh(self, device_type: str):
        """The job's mesh, with Accelerate's flattened dimensions; None with one process."""
        from torch.distributed.device_mesh import init_device_mesh

        dims = [d for d in DIMS if d in self.active_mesh_dims]
        if not dims:
            return None
        mesh = init_device_mesh(device_type, tuple(getattr(self, f"{d}_size") for d in dims), mesh_dim_names=dims)
        # torch wants flattened meshes kept by who made them (slicing them from the root is deprecated)
        self._joint = {joint: mesh[tuple(parts)]._flatten(joint) for joint, parts in (
            (joint, self._split(dims)) for joint, dims in mesh_sizes.JOINT.items()) if parts}
        return mesh

    def submesh(self, *names: str):
        """A mesh dimension (or several of the root's) by name; Accelerate's joint names are kept flattened."""
        joint = getattr(self, "_joint", {})
        if not any(name in joint for name in names):
            return self.device_mesh[names if len(names) > 1 else names[0]]
        if len(names) == 1:
            return joint[names[0]]
        # (dp_replicate, dp_shard_cp) for HSDP under cp: slicing a flattened name from the root is deprecated, so
        # the pieces are joined as torch's own mesh bookkeeping joins them
        from torch.distributed.device_mesh import DeviceMesh

        return DeviceMesh._concatenate([joint[n] if n in joint else self.device_mesh[n] for n in names])

    def sharding_mesh(self):
        """What FSDP2 shards over: (dp_replicate x) dp_shard x cp, HSDP where dp_replicate is split; None under
        tensor parallelism alone (nothing to shard)."""
        names = self.fsdp_dim_names if self.cp_enabled else self.dp_dim_names  # cp 1: dp_shard_cp is dp_shard
        return self.submesh(*names) if names else None

    def rank_in(self, name: str) -> int:
        """This process's place along one mesh dimension; 0 where the dimension is not split (as Accelerate's
        tensor_parallel_rank and kin)."""
        if not self._enabled(name) or self.device_mesh is None:
            return 0
        return self.device_mesh.get_local_rank(name)

    def get_device_mesh(self, device_type: str | None = None):
        if self.device_mesh is None:
            if device_type is None:
                raise HpcError("ParallelismConfig.get_device_mesh(): no mesh built yet",
                               fix="pass the device type (e.g. 'cuda'), or let Accelerator build it")
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise HpcError(f"the mesh was built for {self.device_mesh.device_type}, not {device_type}",
                           fix=f"ask for {self.device_mesh.device_type}")
        return self.device_mesh


def plugin_mesh(sharding_strategy: str, world_size: int, local_world_size: int, device_type: str):
    """The mesh an FSDP plugin's sharding_strategy asks for without a ParallelismConfig: NO_SHARD and HYBRID_SHARD
    a 2-D (replicate x shard) one, (world x 1) and (nodes x local ranks), so that both end in the same HSDP code
    path as ParallelismConfig(dp_replicate, dp_shard); the others one dimension over every rank."""
    from torch.distributed.device_mesh import init_device_mesh

    kind = sharding_strategy
    if kind == "NO_SHARD":
        return init_device_mesh(device_type, (world_size, 1), mesh_dim_names=("replicate", "shard"))
    if kind in ("HYBRID_SHARD", "HYBRID_SHARD_ZERO2"):
        local = local_world_size
        if world_size % local:
            raise HpcError(f"{kind} needs the same number of ranks on every node ({world_size} ranks, "
                           f"{local} on this node)", fix="use FULL_SHARD, or even nodes")
        return init_device_mesh(device_type, (world_size // local, local), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
