"""The enums and small dataclasses of `accelerate.utils.dataclasses` that configuration files and scripts name:
values as Accelerate spells them, so `PrecisionType("bf16")`, `"fp16" in PrecisionType` and comparisons with the
strings from a config file behave the same."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

import torch

from hpc.runtime.big_models.sizes import CustomDtype


class EnumWithContains(enum.EnumMeta):
    """`value in TheEnum` answers whether the value names a member (a plain Enum raises or compares members)."""

    def __contains__(cls, item):
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    def __str__(self):
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [str(member) for member in cls]


class ComputeEnvironment(str, enum.Enum):
    """Where a config file's job runs. hpc runs LOCAL_MACHINE (and SLURM, through its own profiles); a SageMaker
    config is refused by `hpc launch` with a one-line reason."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class SageMakerDistributedType(str, enum.Enum):
    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class DynamoBackend(str, BaseEnum):
    """torch.compile backends by Accelerate's upper-case names (the lower-case value is what torch takes)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class PrecisionType(str, BaseEnum):
    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class FP8BackendType(str, enum.Enum):
    """Which library carries fp8. hpc runs AO (torchao); TE and MSAMP are refused by name when asked for."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


@dataclass
class TensorInformation:
    """A tensor's shape and dtype without its data: what a broadcast sends ahead so the receivers can allocate."""

    shape: torch.Size
    dtype: torch.dtype


@dataclass
class DeepSpeedSequenceParallelConfig:
    """DeepSpeed's (Ulysses) sequence parallelism settings, read from PARALLELISM_CONFIG_SP_* where not given."""

    sp_seq_length: int | None = None
    sp_seq_length_is_variable: bool | None = None
    sp_attn_implementation: str | None = None

    def __post_init__(self):
        if self.sp_seq_length_is_variable is None:
            self.sp_seq_length_is_variable = \
                os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH_IS_VARIABLE", "true").lower() == "true"
        if not self.sp_seq_length_is_variable and self.sp_seq_length is None:
            given = os.environ.get("PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            if given is None:
                raise ValueError("when `sp_seq_length_is_variable` is `False` `sp_seq_length` must be provided "
                                 "either through the constructor or PARALLELISM_CONFIG_SP_SEQ_LENGTH")
            self.sp_seq_length = None if given == "None" else int(given)
        if self.sp_attn_implementation is None:
            self.sp_attn_implementation = os.environ.get("PARALLELISM_CONFIG_SP_ATTN_IMPLEMENTATION")
        attn = self.sp_attn_implementation
        if attn is not None and attn not in ("flash_attention_2", "flash_attention_3", "sdpa") and \
                ("/" not in attn or "flash-attn" not in attn):
            raise ValueError(f"Invalid sp_attn_implementation: {attn}. Must be one of flash_attention_2, "
                             "flash_attention_3, sdpa or a hub-hosted flash attention kernel")


@dataclass
class BnbQuantizationConfig:
    """bitsandbytes' 8- and 4-bit loading settings, checked as Accelerate checks them; loading with them needs
    bitsandbytes (load_and_quantize_model says so when it is missing)."""

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: str | torch.dtype = "fp32"
    torch_dtype: torch.dtype | None = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None

    def __post_init__(self):
        if self.load_in_8bit and self.load_in_4bit:
            raise ValueError("load_in_8bit and load_in_4bit can't be both True")
        if not (self.load_in_8bit or self.load_in_4bit):
            raise ValueError("load_in_8bit and load_in_4bit can't be both False")
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise ValueError("bnb_4bit_quant_type must be in ['fp4','nf4']")
        if isinstance(self.bnb_4bit_compute_dtype, str):
            names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
            if self.bnb_4bit_compute_dtype not in names:
                raise ValueError("bnb_4bit_compute_dtype must be in ['fp32','fp16','bf16']")
            self.bnb_4bit_compute_dtype = names[self.bnb_4bit_compute_dtype]
        if self.skip_modules is not None and not isinstance(self.skip_modules, list):
            raise ValueError("skip_modules must be a list of strings")
        if self.keep_in_fp32_modules is not None and not isinstance(self.keep_in_fp32_modules, list):
            raise ValueError("keep_in_fp_32_modules must be a list of strings")
        if self.load_in_4bit:
            self.target_dtype = CustomDtype.INT4
        else:
            self.target_dtype = torch.int8
        self.torch_dtype = self.torch_dtype or torch.float16

