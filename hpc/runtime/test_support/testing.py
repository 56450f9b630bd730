"""Assertion helpers and skip decorators for distributed tests, as `accelerate.test_utils.testing` names them."""

from __future__ import annotations

import contextlib
import io
import unittest
from typing import Callable

import torch


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """True when every rank holds an equal ``tensor`` (a collective: every rank must call it)."""
    from hpc.runtime.process.collectives import gather
    from hpc.runtime.process.state import PartialState

    mine = tensor[None].clone().to(PartialState().device)
    everyone = gather(mine).cpu()
    return all(torch.equal(row, mine[0].cpu()) for row in everyone)


@contextlib.contextmanager
def assert_exception(exception_class: type[BaseException], msg: str | None = None):
    """The block must raise ``exception_class`` (with ``msg`` in its text, when given)."""
    try:
        yield
    except Exception as error:
        assert isinstance(error, exception_class), f"expected {exception_class.__name__}, got {type(error).__name__}"
        if msg is not None:
            assert msg in str(error), f"expected {msg!r} in the error, got {str(error)!r}"
        return
    raise AssertionError(f"expected {exception_class.__name__}, but the block ran without one")


def capture_call_output(function: Callable, *args, **kwargs) -> str:
    """What ``function(*args, **kwargs)`` printed."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        function(*args, **kwargs)
    return buffer.getvalue()


def skip(test_case):
    return unittest.skip("skipped")(test_case)


def slow(test_case):
    return test_case


def require_cpu(test_case):
    return unittest.skipUnless(not torch.cuda.is_available(), "test requires only a CPU")(test_case)


def _backend() -> tuple[str, int, Callable[[], int]]:
    """The device kind tests run on, how many there are, and its allocated-bytes function, as Accelerate's
    ``get_backend`` picks them (the kinds hpc runs on: CUDA, XPU, MPS, else the CPU)."""
    if torch.cuda.is_available():
        return "cuda", torch.cuda.device_count(), torch.cuda.memory_allocated
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu", torch.xpu.device_count(), torch.xpu.memory_allocated
    if torch.backends.mps.is_available():
        return "mps", 1, torch.mps.current_allocated_memory
    return "cpu", 1, lambda: 0


# Accelerate's examples pick their device and synchronize with these (`getattr(torch, torch_device).synchronize`)
torch_device, device_count, memory_allocated_func = _backend()
