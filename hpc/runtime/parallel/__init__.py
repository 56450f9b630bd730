"""How one model is spread over the mesh: the mesh from a ParallelismConfig (mesh.py), fp8, context and tensor
parallelism, activation checkpointing and compile, applied by the strategies in one fixed order."""
