"""`accelerate.inference` as hpc spells it, and hpc's batch-inference jobs (hpc.runtime.batch_inference)."""

from hpc.runtime.batch_inference.chunk_files import read_outputs
from hpc.runtime.batch_inference.job import BatchInference, Chunk

__all__ = ["BatchInference", "Chunk", "read_outputs"]
