"""hpc: from one machine to a multi-node SLURM cluster.

Importing this package must stay cheap and torch-free: the login-node CLI imports it.
"""

__version__ = "0.1.0"
