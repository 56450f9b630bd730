"""The names the Accelerator's methods and the checkpointer import today (world size passed in), kept while they
move to hpc.runtime.collectives, which defines them."""

from hpc.runtime.collectives import (
    REDUCTIONS,
    DistributedOperationException,
    _map,
    _shapes,
    verify_shapes,
)
from hpc.runtime.collectives import gather_across as gather
from hpc.runtime.collectives import gather_object_across as gather_object
from hpc.runtime.collectives import pad_across as pad_across_processes
from hpc.runtime.collectives import reduce_across as reduce
from hpc.runtime.nest import recursively_apply, truncate

__all__ = ["REDUCTIONS", "DistributedOperationException", "_map", "_shapes", "gather", "gather_object",
           "pad_across_processes", "recursively_apply", "reduce", "truncate", "verify_shapes"]
