"""`accelerate.inference` as hpc spells it (`prepare_pippy` and its steps), and hpc's batch-inference jobs."""

from hpc.runtime.inference.batch.chunk_files import read_outputs
from hpc.runtime.inference.batch.job import BatchInference, Chunk
from hpc.runtime.inference.pipeline import prepare_pippy
from hpc.runtime.inference.pippy_steps import build_pipeline, find_pippy_batch_size, generate_device_map, pippy_forward
from hpc.runtime.utilities.reexports import Forwarding

__all__ = ["BatchInference", "Chunk", "build_pipeline", "find_pippy_batch_size", "generate_device_map",
           "pippy_forward", "prepare_pippy", "read_outputs"]

# what Accelerate's module also binds from its other modules, each from its own hpc path
_ALSO = {
    "hpc.state": ["PartialState"],
    "hpc.utils": ["calculate_maximum_sizes", "convert_bytes", "copy_tensor_to_devices", "ignorant_find_batch_size",
                 "infer_auto_device_map", "is_pippy_available", "pad_input_tensors", "send_to_device"],
}
_FORWARD = Forwarding(__name__, _ALSO)


def __getattr__(name):
    return _FORWARD(name)


def __dir__():
    return _FORWARD.names()
