"""`accelerate.inference` as hpc spells it (`prepare_pippy`), and hpc's batch-inference jobs."""

from hpc.runtime.inference.batch.chunk_files import read_outputs
from hpc.runtime.inference.batch.job import BatchInference, Chunk
from hpc.runtime.inference.pipeline import prepare_pippy

__all__ = ["BatchInference", "Chunk", "prepare_pippy", "read_outputs"]
