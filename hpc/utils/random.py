"""`accelerate.utils.random` as hpc spells it: its names, defined in hpc.runtime.process.random_states."""

from hpc.runtime.process.random_states import (
    RNGType,
    set_seed,
    synchronize_rng_state,
    synchronize_rng_states,
)

__all__ = ['RNGType', 'set_seed', 'synchronize_rng_state', 'synchronize_rng_states']
