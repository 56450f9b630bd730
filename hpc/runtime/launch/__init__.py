"""How a node's ranks are started from one Python that imported torch once: torchrun's agent forking its workers
(warm_launch, SLURM's torchrun jobs) and the local profile's ranks (local_ranks). The top room of the runtime: it
imports what every rank imports first, and nothing imports it."""
