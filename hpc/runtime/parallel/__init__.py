"""How one model is spread over the mesh: the mesh from a ParallelismConfig (mesh.py), fp8, context and tensor
parallelism, activation checkpointing and compile, applied by parallelize() (parallelize.py) in one fixed order
around each strategy's own steps (where the weights go, the data-parallel wrap)."""
