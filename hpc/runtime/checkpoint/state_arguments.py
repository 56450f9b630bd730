"""What Accelerate's save_state and load_state take beyond a folder, and what hpc does with it.

``save_state(output_dir, safe_serialization=True, **save_model_func_kwargs)``: hpc's checkpoint has one format
whichever ``safe_serialization`` asks for, every file checksummed and loaded ``weights_only``, so nothing in it is
unpickled (what safetensors give Accelerate's). Accelerate hands ``save_model_func_kwargs`` to DeepSpeed's
``save_checkpoint`` and ignores them otherwise; hpc ignores them likewise, and refuses them under DeepSpeed, whose
checkpoint it writes itself (they would not be honoured).

``load_state(input_dir, load_kwargs=None, **load_model_func_kwargs)``: Accelerate passes these to ``torch.load``
of the optimizer and scheduler states and to the models' ``load_state_dict`` (``strict``). hpc loads every file
``weights_only`` onto the right device and every model strictly, and refuses in one line what would loosen that
(``strict=False``, ``weights_only=False``, a pickle module) rather than quietly load otherwise.
"""

from __future__ import annotations

from hpc.errors import HpcError


def check_save(save_model_func_kwargs: dict, deepspeed: bool) -> None:
    if save_model_func_kwargs and deepspeed:
        raise HpcError(f"save_state({', '.join(f'{k}=...' for k in sorted(save_model_func_kwargs))}): hpc writes the "
                       "DeepSpeed checkpoint itself and cannot pass these to DeepSpeed's save_checkpoint",
                       fix="leave them out (the whole state is saved and resumes exactly)")


def check_load(kwargs: dict) -> None:
    loosening = {k: v for k, v in kwargs.items()
                 if not (k == "map_location" or (k in ("strict", "weights_only") and v is True))}
    if loosening:
        raise HpcError(f"load_state({', '.join(f'{k}={v!r}' for k, v in sorted(loosening.items()))}): hpc loads "
                       "checkpoints strictly and weights_only, whatever is asked",
                       fix="leave these out: the checkpoint is hpc's own and loads whole")
