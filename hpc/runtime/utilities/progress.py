"""`accelerate.utils.tqdm`: a progress bar shown by each node's first process only (one bar, not one per rank)."""

from __future__ import annotations


def tqdm(*args, main_process_only: bool = True, **kwargs):
    from tqdm.auto import tqdm as bar

    from hpc.runtime.process.state import PartialState

    if args and isinstance(args[0], bool):
        raise ValueError("Passing `True` or `False` as the first argument to Accelerate's `tqdm` wrapper is "
                         "unsupported. Please use the `main_process_only` keyword argument instead.")
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = PartialState().local_process_index != 0
    return bar(*args, **kwargs, disable=disable)
