"""`accelerate.inference` as hpc spells it (`prepare_pippy`), and hpc's batch-inference jobs."""

from hpc.runtime.batch_inference.chunk_files import read_outputs
from hpc.runtime.batch_inference.job import BatchInference, Chunk
from hpc.runtime.pipeline_inference import prepare_pippy

__all__ = ["BatchInference", "Chunk", "prepare_pippy", "read_outputs"]
