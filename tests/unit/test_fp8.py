"""mixed_precision="fp8": torchao's Float8Linear conversion (which needs no GPU), the recipe kwargs Accelerate
users pass, and the one-line refusals (a device without fp8 tensor cores, TransformerEngine, MS-AMP)."""

import pytest
import torch

from hpc.errors import HpcError
from hpc.runtime.parallel import fp8
from hpc.utils import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 10))


def converted(model) -> list[str]:
    from torchao.float8.float8_linear import Float8Linear

    return [name for name, m in model.named_modules() if isinstance(m, Float8Linear)]


def test_every_linear_but_the_first_and_the_last_becomes_fp8_keeping_its_parameters():
    model = mlp()
    before = [p for p in model.parameters()]
    fp8.convert(model)
    assert converted(model) == ["2", "4"]  # 0 and 6 are the ends; 6 (10 outputs) would not divide by 16 either
    assert [p for p in model.parameters()] == before  # the same objects: an optimizer built on them goes on


def test_a_recipe_chooses_the_layers_and_fsdp_gathers_in_fp8():
    model = fp8.convert(mlp(), AORecipeKwargs(module_filter_func=lambda m, name: name == "0"), fsdp_all_gather=True)
    assert converted(model) == ["0"]
    assert model[0].config.enable_fsdp_float8_all_gather


@pytest.mark.parametrize("handlers,words", [
    ({TERecipeKwargs: TERecipeKwargs()}, "TransformerEngine is not driven by hpc"),
    ({MSAMPRecipeKwargs: MSAMPRecipeKwargs()}, "MS-AMP is not driven by hpc"),
    ({FP8RecipeKwargs: FP8RecipeKwargs(backend="te")}, "TransformerEngine"),
    ({FP8RecipeKwargs: FP8RecipeKwargs(backend="xla")}, "'XLA' is not one of Accelerate's"),
])
def test_backends_hpc_does_not_drive_are_one_line(handlers, words):
    with pytest.raises(HpcError) as e:
        fp8.backend_of(handlers)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_torchao_is_the_default_backend_and_its_absence_is_one_line(monkeypatch):
    assert fp8.backend_of({}) == "AO" == fp8.backend_of({AORecipeKwargs: AORecipeKwargs()})
    monkeypatch.setattr(fp8.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(HpcError, match="pip install torchao"):
        fp8.backend_of({})


def test_an_fp8_run_on_a_device_without_fp8_tensor_cores_is_refused_before_it_trains(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    from hpc import Accelerator

    with pytest.raises(HpcError) as e:
        Accelerator(mixed_precision="fp8", cpu=True)
    text = str(e.value)
    assert "fp8 tensor cores" in text and "runs on cpu" in text and "\n" not in text
