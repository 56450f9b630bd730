"""`accelerate.local_sgd` as hpc spells it: its names, defined in hpc.runtime.training.local_sgd."""

from hpc.runtime.training.local_sgd import (
    DistributedType,
    LocalSGD,
    distributed_type_of,
)

__all__ = ['DistributedType', 'LocalSGD', 'distributed_type_of']
