"""The Accelerator's settings, resolved in one place: code > runtime config > ACCELERATE_* > defaults; PartialState
asks the same resolver (no process group is formed here)."""

import pytest

from hpc.contract.runtime_config import RuntimeConfig
from hpc.errors import HpcError
from hpc.runtime import settings, settings_resolver

ARGUMENTS = dict(device_placement=True, split_batches=None, mixed_precision=None, gradient_accumulation_steps=None,
                 cpu=False, dataloader_config=None, deepspeed_plugin=None, fsdp_plugin=None, torch_tp_plugin=None,
                 megatron_lm_plugin=None, rng_types=None, log_with=None, project_dir=None, project_config=None,
                 gradient_accumulation_plugin=None, step_scheduler_with_optimizer=True, kwargs_handlers=None,
                 dynamo_backend=None, dynamo_plugin=None, deepspeed_plugins=None, parallelism_config=None, seed=0,
                 auto_resume=None, checkpoint_keep=None, checkpoint_async=None, checkpoint_fsync=None)


def resolve(**given):
    return settings_resolver.resolve({**ARGUMENTS, **given})


@pytest.fixture
def job(tmp_path, monkeypatch):
    """Write the runtime config of a job this process runs in."""
    def write(**values):
        RuntimeConfig(**values).write(tmp_path / "runtime.json")
        monkeypatch.setenv("HPC_RUNTIME_CONFIG", str(tmp_path / "runtime.json"))
    monkeypatch.delenv("HPC_RUNTIME_CONFIG", raising=False)
    for name in ("ACCELERATE_MIXED_PRECISION", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"):
        monkeypatch.delenv(name, raising=False)
    return write


def test_outside_a_job_the_defaults_hold(job):
    s = resolve()
    assert (s.mixed_precision, s.accumulation_steps, s.strategy, s.cpu) == ("no", 1, None, False)
    assert (s.resilience.in_job, s.resilience.hang_timeout_s, s.resilience.requeue_signal) == (False, 0.0, "USR1")
    assert (s.resilience.max_requeues, s.checkpointing.keep, s.checkpointing.arrival_timeout_s) == (3, 2, 600.0)
    assert settings.job_setting("mixed_precision") is None


def test_code_beats_the_runtime_config_which_beats_the_environment(job, monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    assert (resolve().mixed_precision, resolve().accumulation_steps) == ("fp16", 4)  # the environment
    job(mixed_precision="bf16", checkpoint_keep=5, hang_timeout=60.0)
    s = resolve()
    assert (s.mixed_precision, s.accumulation_steps, s.checkpointing.keep) == ("bf16", 4, 5)  # the job's, over it
    assert settings.job_setting("mixed_precision") == "bf16"  # what PartialState/AcceleratorState read
    assert (s.resilience.in_job, s.resilience.hang_timeout_s, s.checkpointing.arrival_timeout_s) == (True, 60.0, 60.0)
    s = resolve(mixed_precision="no", gradient_accumulation_steps=2, checkpoint_keep=3)
    assert (s.mixed_precision, s.accumulation_steps, s.checkpointing.keep) == ("no", 2, 3)  # code, over both


def test_in_a_job_the_hang_watch_is_on_by_default(job):
    job()
    assert resolve().resilience.hang_timeout_s == settings.DEFAULT_HANG_TIMEOUT_S


def test_refusals_name_the_argument(job):
    with pytest.raises(HpcError, match="megatron_lm_plugin"):
        resolve(megatron_lm_plugin=object())
    with pytest.raises(HpcError, match="device_placement=False"):
        resolve(device_placement=False)
    with pytest.raises(HpcError, match="both given"):
        resolve(fsdp_plugin=object(), deepspeed_plugin={})
