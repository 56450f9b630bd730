"""Accelerate's checkpointing functions (accelerate.checkpointing), with its signatures and its folder layout:
``model.safetensors`` (``pytorch_model.bin`` without safe serialization; ``_<i>`` for the i-th after the first),
``optimizer.bin``, ``scheduler.bin``, ``dl_state_dict.bin``, ``scaler.pt``, ``random_states_<rank>.pkl`` and
``custom_checkpoint_<i>.pkl``.

Over hpc's checkpoint code: every file is written in a private temporary file and renamed into place
(model_files.save_object), and nothing is unpickled when read (safe_load: torch.load weights_only, one line when a
file holds more); so the random states are written in hpc's tensor form (seed.rng_state), which Accelerate's
folders do not hold: from one of those they are not restored, said in one line, as Accelerate says when it cannot.
A prepared loader's file is hpc's record of where its epoch stands (it resumes at another world size). hpc's own
save_state/load_state (Accelerator) add what these do not: a manifest committed last, checksums, tiers, purging.
"""

from __future__ import annotations

from pathlib import Path

from hpc.errors import HpcError
from hpc.runtime.checkpoint import safe_load
from hpc.runtime.checkpoint.model_files import save_object
from hpc.runtime.process.seed import rng_state, set_rng_state
from hpc.runtime.tracking.rank_logging import get_logger

logger = get_logger(__name__)


def _nth(name: str, index: int) -> str:
    """Accelerate's names for the index-th object: ``optimizer.bin``, ``optimizer_1.bin``, ..."""
    if not index:
        return name
    stem, dot, suffix = name.partition(".")
    return f"{stem}_{index}{dot}{suffix}"


def _writes_here(save_on_each_node: bool) -> bool:
    from hpc.runtime.process.state import PartialState

    state = PartialState()
    return state.is_local_main_process if save_on_each_node else state.is_main_process


def save_accelerator_state(output_dir: str, model_states: list[dict], optimizers: list, schedulers: list,
                           dataloaders: list, process_index: int, step: int, scaler=None,
                           save_on_each_node: bool = False, safe_serialization: bool = True) -> Path:
    """The models' state dicts, the optimizers', schedulers', loaders' and scaler's states (by the main process,
    or each node's with ``save_on_each_node``), and this process's random states with ``step``."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if _writes_here(save_on_each_node):
        for i, state in enumerate(model_states):
            name = _nth("model.safetensors" if safe_serialization else "pytorch_model.bin", i)
            save_object(state, output_dir / name, safe_serialization=safe_serialization)
        for i, optimizer in enumerate(optimizers):
            save_object(optimizer.state_dict(), output_dir / _nth("optimizer.bin", i))
        for i, scheduler in enumerate(schedulers):
            save_object(scheduler.state_dict(), output_dir / _nth("scheduler.bin", i))
        for i, loader in enumerate(dataloaders):
            if callable(getattr(loader, "state_dict", None)):  # hpc's prepared loaders, StatefulDataLoaders
                save_object(loader.state_dict(), output_dir / _nth("dl_state_dict.bin", i))
        if scaler is not None:
            save_object(scaler.state_dict(), output_dir / "scaler.pt")
    save_object({"step": step, **rng_state()}, output_dir / f"random_states_{process_index}.pkl")
    logger.info(f"Accelerator state saved in {output_dir}")
    return output_dir


def load_accelerator_state(input_dir: str, models: list, optimizers: list, schedulers: list, dataloaders: list,
                           process_index: int, scaler=None, map_location=None, load_kwargs: dict | None = None,
                           **load_model_func_kwargs) -> dict:
    """What save_accelerator_state wrote, into the objects given; returns ``{"step": ...}`` when the random states
    held it. ``map_location``: None or "cpu", or "on_device" (this process's device) for the optimizers."""
    if map_location not in (None, "cpu", "on_device"):
        raise TypeError("Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, or "
                        "`'on_device'`")
    if map_location == "on_device":
        from hpc.runtime.process.state import PartialState

        map_location = PartialState().device
    map_location = map_location or "cpu"
    load_kwargs = {k: v for k, v in (load_kwargs or {}).items() if k != "weights_only"}  # never unpickled
    input_dir = Path(input_dir)
    for i, model in enumerate(models):
        safe = input_dir / _nth("model.safetensors", i)
        if safe.exists():
            from safetensors.torch import load_file

            state = load_file(str(safe), device=str(map_location))
        else:
            state = _load(input_dir / _nth("pytorch_model.bin", i), map_location=map_location)
        model.load_state_dict(state, **load_model_func_kwargs)
    for i, optimizer in enumerate(optimizers):
        optimizer.load_state_dict(_load(input_dir / _nth("optimizer.bin", i), map_location=map_location,
                                        **load_kwargs))
    for i, scheduler in enumerate(schedulers):
        scheduler.load_state_dict(_load(input_dir / _nth("scheduler.bin", i), **load_kwargs))
    for i, loader in enumerate(dataloaders):
        path = input_dir / _nth("dl_state_dict.bin", i)
        if path.exists() and callable(getattr(loader, "load_state_dict", None)):
            _restore_loader(loader, _load(path, **load_kwargs))
    if scaler is not None:
        scaler.load_state_dict(_load(input_dir / "scaler.pt"))
    override = {}
    try:
        states = _load(input_dir / f"random_states_{process_index}.pkl")
        if "step" in states:
            override["step"] = states["step"]
        set_rng_state(states)
    except (HpcError, KeyError, OSError, RuntimeError) as e:
        logger.info(f"Could not load random states: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return override


def _restore_loader(loader, state: dict) -> None:
    """A prepared loader goes back to the top of the saved epoch, as Accelerate's load_state does (a
    StatefulDataLoader's to where it stood); anything else gets its state dict."""
    restart = getattr(loader, "restart_epoch", None)
    if restart is None or getattr(loader, "restores_position", True):
        loader.load_state_dict(state)
        return
    from hpc.runtime.data.position import EpochPoint

    restart(EpochPoint.from_state(state, loader.unit, loader.shape, None))


def _load(path: Path, map_location=None, **kwargs):
    if kwargs:
        raise HpcError(f"load_kwargs {sorted(kwargs)} are not supported by hpc's loads (weights_only, no pickles)",
                       fix="drop them")
    return safe_load.load(path, map_location=map_location, name=str(path))


def save_custom_state(obj, path: str, index: int = 0, save_on_each_node: bool = False) -> None:
    """``obj.state_dict()`` to ``{path}/custom_checkpoint_{index}.pkl`` (by the main process, or each node's)."""
    if _writes_here(save_on_each_node):
        location = Path(path) / f"custom_checkpoint_{index}.pkl"
        logger.info(f"Saving the state of {type(obj).__name__} to {location}")
        save_object(obj.state_dict(), location)


def load_custom_state(obj, path: str, index: int = 0) -> None:
    """``obj.load_state_dict`` of ``{path}/custom_checkpoint_{index}.pkl``, read with weights_only (Accelerate reads
    it with full unpickling; a state that needs that is refused in one line unless the folder is trusted)."""
    location = Path(path) / f"custom_checkpoint_{index}.pkl"
    logger.info(f"Loading the state of {type(obj).__name__} from {location}")
    obj.load_state_dict(_load(location, map_location="cpu"))


__all__ = ["load_accelerator_state", "load_custom_state", "save_accelerator_state", "save_custom_state"]
