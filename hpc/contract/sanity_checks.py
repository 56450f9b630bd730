"""The checks of an `hpc test` job, by name: each rank of the job (hpc.runtime.sanity) writes a result per name,
and `hpc test` on the login node reads them back in this order."""

# in the order they run, which is the order `hpc test` reports them in
PROCESS_GROUP = "process group"
ALL_REDUCE = "all-reduce sum"
BROADCAST = "broadcast from rank 0"
ALL_GATHER = "all-gather order"
TRAINING = "training step"
BARRIER = "barrier"
CHECKS = (PROCESS_GROUP, ALL_REDUCE, BROADCAST, ALL_GATHER, TRAINING, BARRIER)
