"""prepare_pippy in one process: bad input refused in one line naming the fix, where "auto" cuts, the refusals of
tracing, and a world of one running the model whole. The 2-rank pipeline: tests/test_pipeline_inference.py."""


import pytest
import torch
from torch.utils import _pytree as pytree

from hpc.errors import HpcError
from hpc.runtime.inference import pipeline as pp
from tests.unit.test_accelerate_names import single  # noqa: F401 - the fresh one-process PartialState fixture


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4)).eval()


X = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_one_process_runs_the_model_whole(single):
    model = mlp()
    want = model(X)
    assert pp.prepare_pippy(model, split_points=["2"], example_args=(X[:2],)) is model
    assert model.hf_split_points == ["2"] and torch.equal(model(X), want)
    assert pp.prepare_pippy(mlp(), example_args=X).hf_split_points == []  # auto, one stage; a lone tensor is fine


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"split_points": ["2.weight"]}, "no module '2.weight'; fix: '2.weight' is a tensor: name the module that holds "
                                     "it, '2'"),
    ({"split_points": ["layer2"]}, "the model has no module 'layer2'; fix: name modules as model.named_modules()"),
    ({"split_points": "2"}, "takes 'auto' or a list of module names; fix: pass split_points=['2']"),
    ({"split_points": [""]}, "split point '' is not a submodule's name"),
    ({"split_points": ["2", "2"]}, "names a module twice"),
    ({"example_args": ()}, "needs example inputs to trace the model"),
    ({"example_args": {"x": X}}, "takes a tuple of the model's inputs, not a dict"),
    ({"example_args": (X, X[:2])}, "must share a batch dim 0 of at least 1 row (got (4, 8), (2, 8))"),
    ({"example_args": (X[0, 0],)}, "must share a batch dim 0"),
    ({"example_kwargs": [X]}, "takes a dict, not a list"),
    ({"num_chunks": 0}, "prepare_pippy(num_chunks=0) must be a whole number of at least 1; fix: leave it out"),
    ({"num_chunks": True}, "prepare_pippy(num_chunks=True)"),
])
def test_bad_input_is_one_line_naming_the_fix(single, kwargs, message):
    with pytest.raises(HpcError) as caught:
        pp.prepare_pippy(mlp(), **{"example_args": (X,), **kwargs})
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.fix


def test_auto_cuts_by_bytes_opening_only_what_is_bigger_than_a_stage():
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)),
                                torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
    assert pp._auto_split_points(model, 2, []) == ["1"]  # the first half is module 0, whole
    assert pp._auto_split_points(model, 3, []) == ["0.1", "2"]  # 0 is bigger than a third, so it is opened
    assert pp._auto_split_points(model, 3, ["Sequential"]) == ["1", "2"]  # a class that stays whole is not
    with pytest.raises(HpcError, match="3 modules to cut between, too few for 4 stages"):
        pp._auto_split_points(model, 4, ["Sequential"])
    assert pp._auto_split_points(model, 1, []) == []


@pytest.mark.parametrize(("weights", "stages", "cuts"), [
    ([1, 1, 1, 1], 2, [2]),
    ([10, 1, 1, 1], 2, [1]),  # a stage gets at least one unit, however heavy the first
    ([1, 1, 1, 10], 2, [3]),
    ([1, 0, 1, 0], 2, [2]),  # a weightless unit stays with the one before it
    ([0, 0, 0], 3, [1, 2]),  # nothing to weigh: counted
    ([5, 5, 5, 5, 5, 5], 3, [2, 4]),
])
def test_balanced_cuts(weights, stages, cuts):
    assert pp._balanced_cuts(weights, stages) == cuts


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.second(self.first(x)) + x  # the second stage would read the model's input


class Branching(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.second(self.first(x)) if x.sum() > 0 else x  # data-dependent: torch.export cannot trace it


def test_a_misspelt_split_point_gets_the_near_names(single):
    with pytest.raises(HpcError, match=r"no module 'secnd'; fix: use one of \['second'\]"):
        pp.prepare_pippy(Residual(), split_points=["secnd"], example_args=(torch.ones(2, 4),))


# torch.export's own FutureWarning (a TreeSpec pickled inside it), nothing of ours
@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_a_later_stage_that_reads_an_input_is_refused_when_traced():
    model = Residual()
    pipe, output_spec = pp._trace(model, ["second"], (torch.ones(2, 4),), {})
    assert output_spec.num_leaves == 1 and "forward" not in vars(model.second)  # pipeline()'s marker is taken off again
    with pytest.raises(HpcError, match="stage 1 .from 'second' on. reads the model's input 'x' itself"):
        pp._check_stages(pipe, ["second"], 2)
    with pytest.raises(HpcError, match="made 2 stages for 3 ranks"):
        pp._check_stages(pipe, ["second"], 3)


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_a_model_torch_export_cannot_trace_is_one_line_with_the_cause():
    model = Branching()
    with pytest.raises(HpcError) as caught:
        pp._trace(model, ["second"], (torch.ones(2, 4),), {})
    assert str(caught.value).startswith("prepare_pippy could not trace the model: ")
    assert "use_cache=False" in caught.value.fix and "\n" not in str(caught.value)
    assert "forward" not in vars(model.second)


def test_a_call_is_checked_against_the_example():
    example = pp._layout((X[:2],), {"mask": torch.ones(2, 3, dtype=torch.bool), "scale": 2})
    assert pp._rows_or_problem((X[:3],), {"scale": 2, "mask": torch.ones(3, 3, dtype=torch.bool)}, example, 4) == 3
    problem, fix = pp._rows_or_problem((X,), {"mask": torch.ones(4, 3, dtype=torch.bool), "scale": 3}, example, 4)
    assert problem == "scale is 3, but the model was traced with 2" and fix
    problem, _ = pp._rows_or_problem((X,), {"mask": torch.ones(3, 3, dtype=torch.bool), "scale": 2}, example, 4)
    assert problem.startswith("the call has [3, 4] rows")


def test_padding_repeats_the_last_row_and_the_cut_takes_it_off():
    padded = pp._pad_rows(((X[:3],), {}), 3, 4)[0][0]
    assert padded.shape == (4, 8) and torch.equal(padded[3], X[2])
    output = (torch.arange(8).reshape(4, 2), torch.zeros(2))
    cut = pp._cut_rows(output, 3, 4)
    assert cut[0].shape == (3, 2) and cut[1].shape == (2,)  # only tensors as long as the padded batch


class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.second(self.first(x))
        return {"double": 2 * y, "rows": (y.sum(1), y.mean(1))}


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_the_last_stages_tensors_are_put_back_in_the_models_output_type():
    spec = pp._trace(Pair(), ["second"], (X[:2],), {})[1]  # seen as torch.export runs the forward
    leaves = (X, X[:, 0], X[:, 1])
    got = pp._as_model_output(leaves, spec)
    assert list(got) == ["double", "rows"] and got["double"] is leaves[0] and got["rows"][1] is leaves[2]
    assert pp._as_model_output(X, pytree.tree_structure(X)) is X  # a tensor stays a tensor
    assert pp._as_model_output((X, X), spec) == (X, X)  # tensors that do not fill the structure: as they came
    assert pp._as_model_output((X, X), None) == (X, X)
