"""`accelerate.inference` as hpc spells it (`prepare_pippy` and its steps), and hpc's batch-inference jobs."""

from hpc.runtime.inference.batch.chunk_files import read_outputs
from hpc.runtime.inference.batch.job import BatchInference, Chunk
from hpc.runtime.inference.pipeline import prepare_pippy
from hpc.runtime.inference.pippy_steps import build_pipeline, find_pippy_batch_size, generate_device_map, pippy_forward

__all__ = ["BatchInference", "Chunk", "build_pipeline", "find_pippy_batch_size", "generate_device_map",
           "pippy_forward", "prepare_pippy", "read_outputs"]
