"""`accelerate.utils.random`: seeding every generator, and making the ranks' generators agree."""

from __future__ import annotations

from hpc.errors import HpcError
from hpc.runtime.process.distributed_type import RNGType

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (CPU and every GPU). ``device_specific``: each rank adds its index, so ranks
    draw differently (e.g. augmentations); ``deterministic``: torch refuses nondeterministic kernels from now on."""
    import torch

    from hpc.runtime.process.seed import seed_every_generator

    if isinstance(seed, bool) or not isinstance(seed, int):
        raise HpcError(f"set_seed({seed!r}) needs a whole number", fix="pass an int, e.g. set_seed(42)")
    if device_specific:
        from hpc.runtime.process.state import PartialState

        seed += PartialState().process_index
    seed_every_generator(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


_SYNCED = (RNGType.TORCH, RNGType.CUDA, RNGType.GENERATOR)


def synchronize_rng_state(rng_type: RNGType | str | None = None, generator=None) -> None:
    """Rank 0's state of one generator copied to every rank."""
    import torch
    import torch.distributed as dist

    from hpc.runtime.process.state import PartialState

    kind = _rng_type(rng_type)
    if kind not in _SYNCED:
        raise HpcError(f"synchronize_rng_state({kind.value!r}): hpc synchronizes torch, cuda and generator only",
                       fix="drop it from rng_types")
    if kind == RNGType.GENERATOR and generator is None:
        raise HpcError("synchronize_rng_state('generator') needs the generator", fix="pass generator=...")
    if kind == RNGType.CUDA and not torch.cuda.is_available():
        raise HpcError("synchronize_rng_state('cuda') without a GPU", fix="drop 'cuda' from rng_types on CPU")
    state = PartialState()
    if not state.use_distributed:
        return
    get, put = {RNGType.TORCH: (torch.get_rng_state, torch.set_rng_state),
                RNGType.CUDA: (torch.cuda.get_rng_state, torch.cuda.set_rng_state),
                RNGType.GENERATOR: (generator.get_state, generator.set_state) if generator is not None else None}[kind]
    rng_state = get()
    carrier = rng_state.to(state.device) if state.backend and "nccl" in state.backend else rng_state
    dist.broadcast(carrier, src=0)
    put(carrier.cpu())


def synchronize_rng_states(rng_types: list, generator=None) -> None:
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)


def _rng_type(value) -> RNGType:
    try:
        return RNGType(value)
    except ValueError:
        raise HpcError(f"rng type {value!r} is not known",
                       fix=f"use one of {', '.join(t.value for t in _SYNCED)}") from None
