"""MODEL as `hpc estimate-memory` takes it (a count such as 7B, a model folder, module:callable) -> its size.
Only a folder or a module:callable loads torch, through the runtime, and only when given."""

from __future__ import annotations

import os

from hpc.cluster.estimate import MODEL_FORMS, PARAMETER_COUNT, parse_count
from hpc.contract.model_size import ModelSize
from hpc.errors import HpcError


def measure(target: str) -> ModelSize:
    """MODEL as the command takes it -> its size. Only a folder or module:callable imports torch."""
    has_config = os.path.isfile(os.path.join(target, "config.json"))
    # a stray folder named 7B is a count
    if os.path.isdir(target) and (has_config or not PARAMETER_COUNT.fullmatch(target)):
        from hpc.runtime.big_models.model_shapes import build_from_folder, model_size

        return model_size(build_from_folder(target))
    if ":" in target:
        from hpc.runtime.big_models.model_shapes import build_from_callable, model_size

        return model_size(build_from_callable(target))
    if os.sep in target or "/" in target:  # a path that is not there, or a Hub name: hpc reads no Hub
        raise HpcError(f"{target!r} is not a local folder", fix=f"give {MODEL_FORMS} (for a Hub model, "
                       f"download its config first: huggingface-cli download NAME config.json --local-dir DIR)")
    count = parse_count(target)
    return ModelSize(count, 4 * count)
