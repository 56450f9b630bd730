"""Assertion helpers, skip decorators, subprocess runners and test cases for distributed tests, as
`accelerate.test_utils.testing` names them. A `require_*` decorator skips truthfully: it asks the same probes
hpc.utils answers (a platform hpc does not run is never there), and the launch command is `hpc launch`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Callable
from unittest import mock

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



def get_backend() -> tuple[str, int, Callable[[], int]]:
    return _backend()


def get_launch_command(**kwargs) -> list[str]:
    """``hpc launch`` with ``--key=value`` for each keyword (``--key`` for True): what Accelerate's suites prefix
    to a script (``accelerate launch`` there)."""
    command = [sys.executable, "-m", "hpc", "launch"]
    for key, value in kwargs.items():
        if isinstance(value, bool) and value:
            command.append(f"--{key}")
        elif value is not None and not isinstance(value, bool):
            command.append(f"--{key}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    from hpc.runtime.utilities.environment import str_to_bool

    if key not in os.environ:
        return default
    try:
        return bool(str_to_bool(os.environ[key]))
    except ValueError:
        raise ValueError(f"If set, {key} must be yes or no.") from None


def skip(test_case):
    return unittest.skip("Test was skipped")(test_case)


def slow(test_case):
    """Skipped unless RUN_SLOW is set to a true value (as in Accelerate's suites)."""
    return unittest.skipUnless(parse_flag_from_env("RUN_SLOW"), "test is slow")(test_case)


def _requires(condition: Callable[[], bool], reason: str):
    def decorate(test_case):
        return unittest.skipUnless(condition(), reason)(test_case)

    return decorate


def _probe(name: str) -> Callable[[], bool]:
    def ask() -> bool:
        from hpc.runtime import availability
        from hpc.runtime.utilities import probes

        return bool((getattr(availability, name, None) or getattr(probes, name))())

    return ask


def _cuda() -> bool:
    return torch.cuda.is_available()


def _xpu_count() -> int:
    return torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0


require_cpu = _requires(lambda: torch_device == "cpu", "test requires only a CPU")
require_non_cpu = _requires(lambda: torch_device != "cpu", "test requires a GPU")
require_cuda = _requires(_cuda, "test requires a GPU")
require_cuda_or_hpu = _requires(_cuda, "test requires a GPU or HPU")
require_xpu = _requires(lambda: _xpu_count() > 0, "test requires a XPU")
require_cuda_or_xpu = _requires(lambda: _cuda() or _xpu_count() > 0, "test requires a CUDA GPU or XPU")
require_non_xpu = _requires(lambda: torch_device != "xpu", "test requires a non-XPU")
require_non_hpu = _requires(lambda: True, "test requires a non-HPU")  # hpc runs on no HPU
require_fp16 = _requires(_probe("is_fp16_available"), "test requires FP16 support")
require_fp8 = _requires(_probe("is_fp8_available"), "test requires FP8 support")
require_fsdp2 = _requires(lambda: True, "test requires FSDP2 (torch >= 2.5.0)")  # hpc requires a newer torch
require_peft = _requires(_probe("is_peft_available"), "test requires peft")
require_mlu = _requires(_probe("is_mlu_available"), "test require a MLU")
require_sdaa = _requires(_probe("is_sdaa_available"), "test require a SDAA")
require_musa = _requires(_probe("is_musa_available"), "test require a MUSA")
require_npu = _requires(_probe("is_npu_available"), "test require a NPU")
require_neuron = _requires(_probe("is_neuron_available"), "test require a Neuron device")
require_mps = _requires(_probe("is_mps_available"), "test requires a `mps` backend support in `torch`")
require_huggingface_suite = _requires(lambda: _probe("is_transformers_available")() and
                                      _probe("is_datasets_available")(),
                                      "test requires the Hugging Face suite")
require_datasets = _requires(_probe("is_datasets_available"), "test requires the datasets library")
require_transformers = _requires(_probe("is_transformers_available"), "test requires the transformers library")
require_timm = _requires(_probe("is_timm_available"), "test requires the timm library")
require_torchvision = _requires(_probe("is_torchvision_available"), "test requires the torchvision library")
require_triton = _requires(_probe("is_triton_available"), "test requires triton")
require_schedulefree = _requires(_probe("is_schedulefree_available"), "test requires schedulefree")
require_bnb = _requires(_probe("is_bnb_available"), "test requires the bitsandbytes library")
require_tpu = _requires(_probe("is_torch_xla_available"), "test requires TPU")
require_non_torch_xla = _requires(lambda: not _probe("is_torch_xla_available")(), "test requires an env without "
                                  "TorchXLA")
require_single_device = _requires(lambda: torch_device != "cpu" and device_count == 1,
                                  "test requires a single device accelerator")
require_single_gpu = _requires(lambda: torch.cuda.device_count() == 1, "test requires a GPU")
require_single_xpu = _requires(lambda: _xpu_count() == 1, "test requires a XPU")
require_multi_device = _requires(lambda: device_count > 1, "test requires multiple hardware accelerators")
require_multi_gpu = _requires(lambda: torch.cuda.device_count() > 1, "test requires multiple GPUs")
require_multi_xpu = _requires(lambda: _xpu_count() > 1, "test requires multiple XPUs")
require_multi_gpu_or_xpu = _requires(lambda: (_cuda() or _xpu_count() > 0) and device_count > 1,
                                     "test requires multiple GPUs or XPUs")
require_deepspeed = _requires(_probe("is_deepspeed_available"), "test requires DeepSpeed")
require_tp = _requires(lambda: _probe("is_transformers_available")(), "test requires transformers >= 4.52.0")
require_tensorboard = _requires(_probe("is_tensorboard_available"), "test requires Tensorboard")
require_wandb = _requires(_probe("is_wandb_available"), "test requires wandb")
require_trackio = _requires(_probe("is_trackio_available"), "test requires trackio")
require_comet_ml = _requires(_probe("is_comet_ml_available"), "test requires comet_ml")
require_aim = _requires(_probe("is_aim_available"), "test requires aim")
require_clearml = _requires(_probe("is_clearml_available"), "test requires clearml")
require_dvclive = _requires(_probe("is_dvclive_available"), "test requires dvclive")
require_swanlab = _requires(_probe("is_swanlab_available"), "test requires swanlab")
require_pandas = _requires(_probe("is_pandas_available"), "test requires pandas")
require_mlflow = _requires(_probe("is_mlflow_available"), "test requires mlflow")
require_pippy = _requires(_probe("is_pippy_available"), "test requires pippy")
require_import_timer = _requires(_probe("is_import_timer_available"), "test requires tuna interpreter")
require_transformer_engine = _requires(_probe("is_transformer_engine_available"), "test requires transformers engine")
require_transformer_engine_mxfp8 = _requires(_probe("is_transformer_engine_mxfp8_available"),
                                             "test requires transformers engine MXFP8 block scaling")
require_torchao = _requires(_probe("is_torchao_available"), "test requires torchao")
require_matplotlib = _requires(_probe("is_matplotlib_available"), "test requires matplotlib")
require_trackers = _requires(lambda: any(_probe(p)() for p in ("is_wandb_available", "is_tensorboard_available",
                                                                 "is_trackio_available", "is_swanlab_available"))
                             and not _probe("is_comet_ml_available")(),
                             "test requires at least one tracker to be available and for `comet_ml` to not be "
                             "installed")
require_torchdata_stateful_dataloader = _requires(_probe("is_torchdata_stateful_dataloader_available"),
                                                  "test requires torchdata.stateful_dataloader")


def require_torch_min_version(test_case=None, version=None):
    if test_case is None:
        return functools.partial(require_torch_min_version, version=version)
    from hpc.runtime.utilities.versions import is_torch_version

    return unittest.skipUnless(is_torch_version(">=", version), f"test requires torch version >= {version}")(test_case)


def run_first(test_case):
    """Marked to run first where pytest-order is installed (pytest.mark.order(1)); as it is otherwise."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return test_case
    import pytest

    return pytest.mark.order(1)(test_case)


class TempDirTestCase(unittest.TestCase):
    """One private temporary folder (``self.tmpdir``) for the class, emptied before each test, removed after."""

    clear_on_setup = True

    @classmethod
    def setUpClass(cls):
        cls.tmpdir = Path(tempfile.mkdtemp())  # mkdtemp: 0700, this user's

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def setUp(self):
        if self.clear_on_setup:
            for path in self.tmpdir.glob("*"):
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


class AccelerateTestCase(unittest.TestCase):
    """Resets the process's Accelerator state after each test, so a test's Accelerator does not leak into the
    next."""

    def tearDown(self):
        super().tearDown()
        from hpc.runtime.process.gradient_state import GradientState
        from hpc.runtime.process.state import AcceleratorState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()


class MockingTestCase(unittest.TestCase):
    """``self.add_mocks(m)`` in setUp starts mocks that stop when the test ends."""

    def add_mocks(self, mocks: mock.Mock | list):
        self.mocks = mocks if isinstance(mocks, (tuple, list)) else [mocks]
        for patcher in self.mocks:
            patcher.start()
            self.addCleanup(patcher.stop)


class _RunOutput:
    def __init__(self, returncode: int, stdout: list[str], stderr: list[str]):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


async def _stream(cmd: list[str], env, stdin, timeout, quiet: bool, echo: bool) -> _RunOutput:
    if echo:
        print("\nRunning: ", " ".join(cmd))
    process = await asyncio.create_subprocess_exec(cmd[0], *cmd[1:], stdin=stdin, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE, env=env)
    out: list[str] = []
    err: list[str] = []

    async def read(stream, sink, pipe, label):
        while line := await stream.readline():
            text = line.decode("utf-8").rstrip()
            sink.append(text)
            if not quiet:
                print(label, text, file=pipe)

    try:
        await asyncio.wait_for(asyncio.gather(read(process.stdout, out, sys.stdout, "stdout:"),
                                              read(process.stderr, err, sys.stderr, "stderr:")), timeout)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError(f"'{' '.join(cmd)}' did not finish in {timeout} s") from None
    return _RunOutput(await process.wait(), out, err)


def execute_subprocess_async(cmd: list, env=None, stdin=None, timeout=180, quiet=False, echo=True) -> _RunOutput:
    """Runs ``cmd`` (paths allowed), streaming its output; RuntimeError with its stderr when it fails."""
    cmd = [str(c) for c in cmd]
    result = asyncio.run(_stream(cmd, env, stdin, timeout, quiet, echo))
    if result.returncode > 0:
        raise RuntimeError(f"'{' '.join(cmd)}' failed with returncode {result.returncode}\n\n"
                           "The combined stderr from workers follows:\n" + "\n".join(result.stderr))
    return result


def pytest_xdist_worker_id() -> int:
    return int(re.sub(r"^gw", "", os.environ.get("PYTEST_XDIST_WORKER", "gw0")))


def get_torch_dist_unique_port() -> int:
    return 29500 + pytest_xdist_worker_id()


class SubprocessCallException(Exception):
    pass


def run_command(command: list, return_stdout: bool = False, env=None):
    command = [str(c) for c in command]
    try:
        output = subprocess.check_output(command, stderr=subprocess.STDOUT, env=env or os.environ.copy())
    except subprocess.CalledProcessError as error:
        raise SubprocessCallException(f"Command `{' '.join(command)}` failed with the following error:\n\n"
                                      f"{error.output.decode()}") from error
    return output.decode("utf-8") if return_stdout else None


def path_in_accelerate_package(*components: str) -> Path:
    """A path inside the installed hpc package (Accelerate's own files, such as its test scripts, are not part of
    hpc: a test that runs one of them names a path that does not exist here)."""
    import hpc

    return Path(hpc.__file__).parent.joinpath(*components)
