"""Accelerate's `prepare_pippy`: pipeline-parallel inference over the ranks, on torch.distributed.pipelining.

Why: a model too big for one device runs as one stage per rank, and a batch goes through in ``num_chunks``
microbatches so that the stages work at the same time (GPipe). What: the model is traced once (torch.export) on
``example_args``/``example_kwargs``, which are one microbatch; it is cut before each split point (named, or balanced
by size with "auto"); its ``forward`` then runs the schedule and every rank must call it. A call takes up to
``num_chunks`` times the example's rows: the first rank's inputs are used, a short batch is padded and its output cut
back. The output, in the model's own output type, is on the last rank (on every rank with ``gather_output``),
elsewhere None.
"""

from __future__ import annotations

import difflib
import itertools
import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils import _pytree as pytree

from hpc.errors import HpcError, shorten, shown
from hpc.runtime.big_models.sizes import compute_module_sizes
from hpc.runtime.process.nest import send_to_device
from hpc.runtime.process.state import PartialState

__all__ = ["prepare_pippy"]

logger = logging.getLogger(__name__)

_TRACE_FIX = ("make the model traceable by torch.export (no data-dependent Python control flow; for transformers "
              "models pass use_cache=False in the config or example_kwargs), see https://pytorch.org/docs/stable/export.html")


def prepare_pippy(model: nn.Module, split_points: str | list[str] | None = "auto",
                  no_split_module_classes: list[str] | None = None, example_args: tuple[Any, ...] | None = (),
                  example_kwargs: dict[str, Any] | None = None, num_chunks: int | None = None,
                  gather_output: bool | None = False) -> nn.Module:
    """Split ``model`` into one pipeline stage per rank and make its ``forward`` run the pipeline (in place).

    ``split_points``: "auto" (stages balanced by parameter bytes, never inside a class of
    ``no_split_module_classes``, by default the model's ``_no_split_modules``) or the names of the modules each later
    stage starts with, one fewer than the ranks. ``example_args``/``example_kwargs``: one microbatch of inputs, as the
    model is called; every call must keep their layout, dtypes and all dims but the first. ``num_chunks`` (default:
    the number of ranks): microbatches per call, so a call takes at most ``num_chunks`` times the example's rows.
    ``gather_output``: the output on every rank, not only on the last. With one process the model runs whole."""
    state = PartialState()
    example_args, example_kwargs = _examples(model, example_args, example_kwargs)
    num_chunks = state.num_processes if num_chunks is None else num_chunks
    _check_num_chunks(num_chunks)
    rows = _example_rows(example_args, example_kwargs)
    split_points = _split_points(model, split_points, state.num_processes, no_split_module_classes)
    model.hf_split_points = split_points
    if state.num_processes == 1:  # no rank to hand activations on to (torch's stages need a group): run whole
        return model
    if "pippy_stage" in vars(model):  # tracing would run the pipelined forward, collectives and all
        raise HpcError("prepare_pippy: this model is prepared already",
                       fix="prepare a fresh copy of the model; its own forward is model._original_forward")
    if model.training:
        logger.warning("prepare_pippy: the model is in training mode; dropout is traced in as it is now "
                       "(call model.eval() before prepare_pippy for inference)")
    schedule, output_spec = _build_schedule(model, split_points, example_args, example_kwargs, num_chunks, state)
    forward = _PipelinedForward(schedule, state, (example_args, example_kwargs), num_chunks * rows, gather_output,
                                output_spec)
    _install(model, forward, schedule)
    return model


# --- what was given ---------------------------------------------------------------------------------------------

def _examples(model: nn.Module, example_args, example_kwargs) -> tuple[tuple, dict]:
    """The examples as a tuple and a dict, on the model's device (tracing runs there)."""
    if isinstance(example_args, torch.Tensor):
        example_args = (example_args,)
    if example_args is None:
        example_args = ()
    if not isinstance(example_args, (tuple, list)):
        raise HpcError(f"prepare_pippy(example_args=...) takes a tuple of the model's inputs, not a "
                       f"{type(example_args).__name__}", fix="pass example_args=(input_ids,)")
    # a Mapping: Accelerate's examples pass a tokenizer's BatchEncoding (a UserDict) as it is
    if example_kwargs is not None and not isinstance(example_kwargs, Mapping):
        raise HpcError(f"prepare_pippy(example_kwargs=...) takes a dict, not a {type(example_kwargs).__name__}",
                       fix="pass example_kwargs={'input_ids': input_ids}")
    device = next(itertools.chain(model.parameters(), model.buffers()), torch.empty(0)).device
    return tuple(send_to_device(tuple(example_args), device)), send_to_device(dict(example_kwargs or {}), device)


def _check_num_chunks(num_chunks) -> None:
    if isinstance(num_chunks, bool) or not isinstance(num_chunks, int) or num_chunks < 1:
        raise HpcError(f"prepare_pippy(num_chunks={shown(num_chunks)}) must be a whole number of at least 1",
                       fix="leave it out (one microbatch per rank) or pass e.g. num_chunks=4")


def _example_rows(example_args: tuple, example_kwargs: dict) -> int:
    """The example's rows (dim 0), which every tensor must share: the schedule splits each tensor along dim 0."""
    tensors = [t for t in pytree.tree_leaves((example_args, example_kwargs)) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise HpcError("prepare_pippy needs example inputs to trace the model: example_args and example_kwargs "
                       "hold no tensor", fix="pass one microbatch as the model takes it: example_args=(input_ids,)")
    rows = {t.shape[0] if t.dim() else 0 for t in tensors}
    if len(rows) > 1 or 0 in rows:
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
        raise HpcError(f"prepare_pippy: the example tensors must share a batch dim 0 of at least 1 row (got {shapes})",
                       fix="give every example input the microbatch's rows in dim 0")
    return rows.pop()


# --- where the stages begin -------------------------------------------------------------------------------------

def _split_points(model: nn.Module, split_points, stages: int, no_split_module_classes) -> list[str]:
    if split_points is None or (isinstance(split_points, str) and split_points == "auto"):
        no_split = no_split_module_classes or getattr(model, "_no_split_modules", None) or []
        return _auto_split_points(model, stages, [no_split] if isinstance(no_split, str) else list(no_split))
    if isinstance(split_points, str) or not isinstance(split_points, (list, tuple)):
        raise HpcError(f"prepare_pippy(split_points={shown(split_points)}) takes 'auto' or a list of module names",
                       fix=f"pass split_points=[{split_points!r}]" if isinstance(split_points, str)
                       else "pass split_points='auto'")
    names = [_module_name(model, name) for name in split_points]
    if len(set(names)) < len(names):
        raise HpcError(f"prepare_pippy: split_points names a module twice ({names})", fix="name each module once")
    if stages > 1 and len(names) != stages - 1:
        raise HpcError(f"prepare_pippy: {len(names)} split points make {len(names) + 1} stages, but this job has "
                       f"{stages} ranks (one stage each)",
                       fix=f"give {stages - 1} split point{'s' if stages > 2 else ''}, or split_points='auto'")
    return names


def _module_name(model: nn.Module, name) -> str:
    """``name`` if it is a submodule of ``model`` (the model itself cannot begin a later stage)."""
    if not isinstance(name, str) or not name:
        raise HpcError(f"prepare_pippy: split point {shown(name)} is not a submodule's name",
                       fix="name modules as model.named_modules() does, e.g. 'transformer.h.6'")
    try:
        model.get_submodule(name)
    except AttributeError:
        raise HpcError(f"prepare_pippy: the model has no module {name!r}", fix=_nearest_module(model, name)) from None
    return name


def _nearest_module(model: nn.Module, name: str) -> str:
    if name in dict(itertools.chain(model.named_parameters(), model.named_buffers())):
        return f"{name!r} is a tensor: name the module that holds it, {name.rpartition('.')[0]!r}"
    near = difflib.get_close_matches(name, [n for n, _ in model.named_modules() if n], n=3)
    return f"use one of {near}" if near else "name modules as model.named_modules() does"


def _auto_split_points(model: nn.Module, stages: int, no_split: list[str]) -> list[str]:
    """The names that cut the model's modules, in order, into ``stages`` runs of about equal bytes."""
    if stages == 1:
        return []
    sizes = compute_module_sizes(model)
    units = _units(model, sizes, sizes[""] / stages, no_split)
    if len(units) < stages:
        raise HpcError(f"prepare_pippy(split_points='auto'): the model has {len(units)} modules to cut between, "
                       f"too few for {stages} stages", fix="pass split_points yourself, or run on fewer ranks")
    return [units[i][0] for i in _balanced_cuts([size for _, size in units], stages)]


def _units(model: nn.Module, sizes: dict, share: float, no_split: list[str]) -> list[tuple[str, int]]:
    """The modules a stage may begin with, in registration order: a module bigger than one stage's share is
    opened into its children (as a device map does), unless its class must stay whole; a ModuleList or ModuleDict
    always is (forward never calls one, so a stage cannot begin with it)."""
    pending = list(model.named_children())
    units = []
    while pending:
        name, module = pending.pop(0)
        children = [(f"{name}.{child}", sub) for child, sub in module.named_children()]
        container = isinstance(module, (nn.ModuleList, nn.ModuleDict))
        if children and (container or (sizes[name] > share and type(module).__name__ not in no_split)):
            pending = children + pending
        else:
            units.append((name, sizes[name]))
    return units


def _balanced_cuts(weights: list[int], stages: int) -> list[int]:
    """For each later stage, the index of the unit it begins with: the boundary nearest its share of the total,
    leaving every stage at least one unit; of equally near ones the last, so that a module without weights (an
    activation, a dropout) stays with the layer before it."""
    if not sum(weights):  # nothing to weigh (no parameters): an even count of modules
        weights = [1] * len(weights)
    before = list(itertools.accumulate(weights, initial=0))
    cuts, start = [], 0
    for k in range(1, stages):
        target = before[-1] * k / stages
        start = min(range(start + 1, len(weights) - (stages - k) + 1), key=lambda i: (abs(before[i] - target), -i))
        cuts.append(start)
    return cuts


# --- tracing and the schedule -----------------------------------------------------------------------------------

def _build_schedule(model: nn.Module, split_points: list[str], example_args: tuple, example_kwargs: dict,
                    num_chunks: int, state: PartialState):
    from torch.distributed.pipelining import ScheduleGPipe

    pipe, output_spec = _trace(model, split_points, example_args, example_kwargs)
    _check_stages(pipe, split_points, state.num_processes)
    _contiguous_hand_offs(pipe)
    stage = pipe.build_stage(state.process_index, device=state.device)
    return ScheduleGPipe(stage, num_chunks), output_spec


def _trace(model: nn.Module, split_points: list[str], example_args: tuple, example_kwargs: dict):
    from torch.distributed.pipelining import SplitPoint, pipeline

    # pipeline() marks each split point by replacing its module's forward and leaves it so: put the user's back
    saved = {name: model.get_submodule(name).__dict__.get("forward") for name in split_points}
    # a transformers model whose config says use_cache (Llama's and GPT-2's published ones do) returns its KV cache,
    # which torch.export cannot trace and a pipelined forward never uses (it does not generate): traced without it
    config = getattr(model, "config", None)
    cache_off = getattr(config, "use_cache", None) is True and "use_cache" not in example_kwargs
    if cache_off:
        config.use_cache = False
    # torch's pipeline hands the last stage's tensors over bare (one logits tensor, where the model returns
    # CausalLMOutput(logits=...)); the pipelined call gives them back in the model's own output type, as its caller
    # expects (output[0], output.logits). The type is seen as torch.export runs the model's forward
    seen = []
    hook = model.register_forward_hook(lambda _module, _args, output: seen.append(pytree.tree_structure(output)))
    try:
        pipe = pipeline(model, mb_args=example_args, mb_kwargs=example_kwargs or None,
                        split_spec={name: SplitPoint.BEGINNING for name in split_points})
        return pipe, seen[0] if len(seen) == 1 else None
    except RuntimeError as error:
        cause = error.__cause__ or error  # torch's message is generic; the cause names what could not be traced
        raise HpcError(f"prepare_pippy could not trace the model: {shorten(str(cause).splitlines()[0], 300)}",
                       fix=_TRACE_FIX) from error
    finally:
        hook.remove()
        if cache_off:
            config.use_cache = True
        for name, forward in saved.items():
            _restore_forward(model.get_submodule(name), forward)


def _as_model_output(output, spec):
    """The last stage's tensors in the model's output structure ``spec`` (as they came where that is unknown or
    they do not fill it)."""
    if spec is None:
        return output
    leaves = list(output) if isinstance(output, (tuple, list)) and spec.num_leaves != 1 else [output]
    if len(leaves) != spec.num_leaves or not all(isinstance(leaf, torch.Tensor) for leaf in leaves):
        return output
    return pytree.tree_unflatten(leaves, spec)


def _restore_forward(module: nn.Module, forward) -> None:
    module.__dict__.pop("_orig_forward", None)
    if forward is None:
        module.__dict__.pop("forward", None)
    else:
        module.forward = forward


def _check_stages(pipe, split_points: list[str], ranks: int) -> None:
    """One stage per rank, and only the first reading the model's inputs: torch passes those to stage 0 alone, so
    a later stage that reads one fails in the first call (or hangs), not here."""
    stage_calls = [node for node in pipe.split_gm.graph.nodes if node.op == "call_module"]
    if len(stage_calls) != ranks:
        raise HpcError(f"prepare_pippy: split points {split_points} made {len(stage_calls)} stages for {ranks} ranks "
                       "(a module that forward never calls, or calls inside another split point's, makes none)",
                       fix="split at modules forward calls one after another, e.g. a model's blocks")
    inputs = {node for node in pipe.split_gm.graph.nodes if node.op == "placeholder"}
    for index, node in enumerate(stage_calls[1:], start=1):
        read = [arg.name for arg in node.all_input_nodes if arg in inputs]
        if read:
            raise HpcError(f"prepare_pippy: stage {index} (from {split_points[index - 1]!r} on) reads the model's "
                           f"input {read[0]!r} itself, and torch.distributed.pipelining gives the inputs to the first "
                           "stage only", fix="choose split points after which no layer reads a model input (a "
                           "sequence classifier's head reads input_ids to find the last token)")


def _contiguous_hand_offs(pipe) -> None:
    """Each stage sends its outputs contiguous and receives into contiguous buffers. torch sends a stage's outputs
    as they are and makes the receiving buffers with their traced strides, but gloo and NCCL take contiguous
    tensors only: a transformers encoder's attention mask, expanded (stride 0), crosses every split."""
    stages = [pipe.split_gm.get_submodule(node.target) for node in pipe.split_gm.graph.nodes
              if node.op == "call_module"]
    for index, stage in enumerate(stages):
        graph = stage.graph
        for node in graph.nodes if index else ():  # a later stage's inputs are all received (_check_stages)
            value = node.meta.get("val")
            if node.op == "placeholder" and isinstance(value, torch.Tensor) and not value.is_contiguous():
                node.meta["val"] = value.contiguous()
        if index == len(stages) - 1:  # the last stage's outputs stay on its rank
            continue
        output = next(node for node in reversed(graph.nodes) if node.op == "output")

        def contiguous(node):
            value = node.meta.get("val")
            if not isinstance(value, torch.Tensor) or value.is_contiguous():
                return node
            with graph.inserting_before(output):
                made = graph.call_method("contiguous", (node,))
            made.meta["val"] = value.contiguous()
            return made

        output.args = pytree.tree_map_only(torch.fx.Node, contiguous, output.args)
        stage.recompile()


# --- the forward that runs the pipeline -------------------------------------------------------------------------

class _PipelinedForward:
    """The model's forward after prepare_pippy: every rank calls it, the first rank's inputs go in."""

    def __init__(self, schedule, state: PartialState, example: tuple, capacity: int, gather_output: bool,
                 output_spec):
        self.schedule, self.state, self.capacity, self.gather_output = schedule, state, capacity, bool(gather_output)
        self.output_spec = output_spec
        self.example = _layout(*example)
        self.first, self.last = state.process_index == 0, state.process_index == state.num_processes - 1

    def __call__(self, *args, **kwargs):
        rows = self._agree_on_rows(args, kwargs)
        with torch.no_grad():  # forward only: no stage keeps activations for a backward that never comes
            if self.first:
                args, kwargs = _pad_rows(send_to_device((args, kwargs), self.state.device), rows, self.capacity)
                output = self.schedule.step(*args, **kwargs)
            else:
                output = self.schedule.step()
        if self.last:
            output = _cut_rows(_as_model_output(output, self.output_spec), rows, self.capacity)
        if self.gather_output:
            output = _from_last_rank(output, self.state)
        return output

    def _agree_on_rows(self, args: tuple, kwargs: dict) -> int:
        """The first rank checks the call and tells the others how many rows it has, or why it refuses: every
        rank then raises together instead of waiting forever on a stage that failed."""
        verdict = [_rows_or_problem(args, kwargs, self.example, self.capacity) if self.first else None]
        dist.broadcast_object_list(verdict, src=0)
        if isinstance(verdict[0], tuple):
            raise HpcError(verdict[0][0], fix=verdict[0][1])
        return verdict[0]


def _layout(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """The call's leaves with their names, and its structure (keywords in sorted order: their order is free)."""
    named, spec = pytree.tree_flatten_with_path((tuple(args), dict(sorted(kwargs.items()))))
    return [(_leaf_name(path), leaf) for path, leaf in named], spec


def _leaf_name(path) -> str:
    head = f"argument {path[1].idx}" if path[0].idx == 0 else path[1].key
    return head + pytree.keystr(path[2:])


def _rows_or_problem(args: tuple, kwargs: dict, example: tuple[list, Any], capacity: int):
    """The call's rows, or (problem, fix) where this pipeline cannot take it."""
    leaves, spec = _layout(args, kwargs)
    expected, expected_spec = example
    if spec != expected_spec:
        return ("the call's inputs are laid out unlike example_args/example_kwargs "
                f"({[n for n, _ in leaves]} against {[n for n, _ in expected]})",
                "call the model with the same positional and keyword inputs it was prepared with")
    rows = set()
    for (name, leaf), (_, traced) in zip(leaves, expected):
        problem = _leaf_problem(name, leaf, traced)
        if problem:
            return problem, "keep each input's dtype and every dim but the first as in the example"
        if isinstance(leaf, torch.Tensor):
            rows.add(leaf.shape[0])
    if len(rows) != 1 or not 1 <= min(rows) <= capacity:
        return (f"the call has {sorted(rows)} rows; this pipeline takes 1 to {capacity} per call (num_chunks times "
                "the example's rows, traced with fixed shapes)",
                f"split the batch into pieces of at most {capacity} rows, or prepare_pippy with larger examples")
    return rows.pop()


def _leaf_problem(name: str, leaf, traced) -> str | None:
    if isinstance(traced, torch.Tensor):
        if not isinstance(leaf, torch.Tensor) or leaf.dim() != traced.dim() or leaf.dim() == 0:
            return f"{name} is {shown(leaf) if not isinstance(leaf, torch.Tensor) else tuple(leaf.shape)}, " \
                   f"traced as a tensor of shape {tuple(traced.shape)}"
        if leaf.shape[1:] != traced.shape[1:] or leaf.dtype != traced.dtype:
            return (f"{name} is {leaf.dtype} of shape {tuple(leaf.shape)}, traced as {traced.dtype} of shape "
                    f"{tuple(traced.shape)}")
        return None
    try:
        same = bool(leaf == traced)
    except Exception:  # noqa: BLE001 - a value that cannot compare counts as changed
        same = False
    return None if same else f"{name} is {shown(leaf)}, but the model was traced with {shown(traced)}"


def _pad_rows(inputs, rows: int, capacity: int):
    """Every tensor repeated from its last row up to ``capacity`` rows: the traced stages take fixed shapes (a
    repeated real row, not zeros, so that masks and positions stay valid)."""
    if rows == capacity:
        return inputs
    return pytree.tree_map_only(torch.Tensor, lambda t: torch.cat([t, t[-1:].expand(capacity - rows, *t.shape[1:])]),
                                inputs)


def _cut_rows(output, rows: int, capacity: int):
    """The padded rows taken off again (from tensors whose dim 0 is the padded batch)."""
    if rows == capacity:
        return output
    return pytree.tree_map_only(torch.Tensor, lambda t: t[:rows] if t.dim() and t.shape[0] == capacity else t,
                                output)


class _TensorSlot:
    """A tensor's place in an output sent to the other ranks: its shape and dtype travel, its data follows."""

    def __init__(self, tensor: torch.Tensor):
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype


def _from_last_rank(output, state: PartialState):
    """The last rank's output on every rank: its structure as one object, then each tensor by broadcast (the
    others do not know its shapes)."""
    last = state.num_processes - 1
    is_last = state.process_index == last
    box = [pytree.tree_map_only(torch.Tensor, _TensorSlot, output) if is_last else None]
    dist.broadcast_object_list(box, src=last)
    if is_last:
        tensors = [t.contiguous() for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor)]
    else:
        tensors = [torch.empty(s.shape, dtype=s.dtype, device=state.device)
                   for s in pytree.tree_leaves(box[0]) if isinstance(s, _TensorSlot)]
    for tensor in tensors:
        dist.broadcast(tensor, src=last)
    if is_last:
        return output
    received = iter(tensors)
    return pytree.tree_map_only(_TensorSlot, lambda _: next(received), box[0])


def _install(model: nn.Module, forward: _PipelinedForward, schedule) -> None:
    """``forward`` as the model's, keeping the original under Accelerate's names (``__wrapped__`` lets an unwrap
    find it)."""
    def pipelined(*args, **kwargs):
        return forward(*args, **kwargs)

    model._original_forward = model.forward
    model._original_call = model.__call__
    model.pippy_stage = schedule
    pipelined.__wrapped__ = model._original_forward
    model.forward = pipelined
