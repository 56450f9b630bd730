"""`accelerate.commands.config.config_args`: where Accelerate's config file lives and the file read as a dataclass.
`hpc launch` reads the same file (hpc.cluster.config.accelerate_file); this is the Python view scripts use."""

from __future__ import annotations

import dataclasses
import json
import os
from enum import Enum

import yaml

from hpc.errors import HpcError

hf_cache_home = os.path.expanduser(
    os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")))
cache_dir = os.path.join(hf_cache_home, "accelerate")
# Accelerate's own spelling: its "JSON" default is the .yaml file too (JSON is YAML)
default_json_config_file = os.path.join(cache_dir, "default_config.yaml")
default_yaml_config_file = os.path.join(cache_dir, "default_config.yaml")
default_config_file = default_yaml_config_file


@dataclasses.dataclass
class BaseConfig:
    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str = "NO"
    mixed_precision: str | None = "no"
    use_cpu: bool = False
    debug: bool = False

    def to_dict(self) -> dict:
        def plain(value):
            if isinstance(value, Enum):
                return value.value
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()} or None
            return value

        return {k: v for k, v in ((k, plain(v)) for k, v in vars(self).items()) if v is not None}

    @staticmethod
    def process_config(config_dict: dict) -> dict:
        """Accelerate's defaults for what a file leaves out (and its older keys in the new form)."""
        config_dict.setdefault("compute_environment", "LOCAL_MACHINE")
        if "distributed_type" not in config_dict:
            raise ValueError("A `distributed_type` must be specified in the config file.")
        if config_dict["distributed_type"] == "NO":
            config_dict.setdefault("num_processes", 1)
        if "mixed_precision" not in config_dict:
            config_dict["mixed_precision"] = "fp16" if config_dict.get("fp16") else None
        config_dict.pop("fp16", None)
        if "dynamo_backend" in config_dict:
            backend = config_dict.pop("dynamo_backend")
            config_dict["dynamo_config"] = {} if backend == "NO" else {"dynamo_backend": backend}
        for key in ("use_cpu", "debug", "enable_cpu_affinity"):
            config_dict.setdefault(key, False)
        return config_dict

    @classmethod
    def _from(cls, data: dict, path: str):
        data = cls.process_config(dict(data))
        known = {f.name for f in dataclasses.fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(f"The config file at {path} had unknown keys ({extra}), please try upgrading your "
                             "`accelerate` version or fix (and potentially remove) these keys from your config file.")
        return cls(**data)

    @classmethod
    def from_json_file(cls, json_file: str | None = None):
        json_file = json_file or default_json_config_file
        with open(json_file, encoding="utf-8") as handle:
            return cls._from(json.load(handle), json_file)

    def to_json_file(self, json_file: str) -> None:
        with open(json_file, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_yaml_file(cls, yaml_file: str | None = None):
        yaml_file = yaml_file or default_yaml_config_file
        with open(yaml_file, encoding="utf-8") as handle:
            return cls._from(yaml.safe_load(handle), yaml_file)

    def to_yaml_file(self, yaml_file: str) -> None:
        with open(yaml_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle)


@dataclasses.dataclass
class ClusterConfig(BaseConfig):
    """An `accelerate config` file for a local machine or a cluster of them (what `hpc launch` runs)."""

    num_processes: int = -1
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: str | None = None
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str | None = "static"
    same_network: bool | None = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    deepspeed_config: dict | None = None
    fsdp_config: dict | None = None
    parallelism_config: dict | None = None
    megatron_lm_config: dict | None = None
    mpirun_config: dict | None = None
    tpu_name: str | None = None
    tpu_zone: str | None = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: str | None = None
    commands: list[str] | None = None
    tpu_vm: list[str] | None = None
    tpu_env: list[str] | None = None
    dynamo_config: dict | None = None
    downcast_bf16: str | bool | None = None
    fp8_config: dict | None = None
    ipex_config: dict | None = None
    mpirun_hostfile: str | None = None


@dataclasses.dataclass
class SageMakerConfig(BaseConfig):
    """An `accelerate config` file for Amazon SageMaker: read so it can be shown; hpc does not launch it."""

    ec2_instance_type: str = ""
    iam_role_name: str = ""
    image_uri: str | None = None
    profile: str | None = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = "1.10.2"
    transformers_version: str = "4.17.0"
    py_version: str = "py38"
    sagemaker_inputs_file: str | None = None
    sagemaker_metrics_file: str | None = None
    additional_args: dict | None = None
    dynamo_config: dict | None = None
    enable_cpu_affinity: bool = False


def load_config_from_file(config_file: str | None):
    """The config file (Accelerate's default when None) as ClusterConfig, or SageMakerConfig for a SageMaker one."""
    if config_file is not None and not os.path.isfile(config_file):
        raise FileNotFoundError(f"The passed configuration file `{config_file}` does not exist. Please pass an "
                                "existing file to `accelerate launch`, or use the default one created through "
                                "`accelerate config` and run `accelerate launch` without the `--config_file` argument.")
    config_file = config_file or default_config_file
    if not os.path.isfile(config_file):
        raise HpcError(f"no Accelerate config file at {config_file}",
                       fix="write one with `hpc config default` (or write_basic_config())")
    with open(config_file, encoding="utf-8") as handle:
        data = json.load(handle) if config_file.endswith(".json") else yaml.safe_load(handle)
    kind = ClusterConfig if data.get("compute_environment", "LOCAL_MACHINE") == "LOCAL_MACHINE" else SageMakerConfig
    return kind.from_json_file(config_file) if config_file.endswith(".json") else kind.from_yaml_file(config_file)
