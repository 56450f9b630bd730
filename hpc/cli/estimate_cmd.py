"""`hpc estimate-memory`: bytes per GPU per strategy, and the cheapest strategy that fits; or, with --dtypes,
Accelerate's table of sizes per dtype. Torch-free unless a model (a folder or module:callable) is given."""

from __future__ import annotations

import click
from click.core import ParameterSource

from hpc.cli.output import echo_json, table
from hpc.errors import HpcError


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} PiB"


def _dtype_list(given: tuple[str, ...]) -> list[str]:
    from hpc.cluster.estimate import DTYPES

    names = [n.strip() for value in given for n in value.split(",") if n.strip()]
    return list(DTYPES) if "all" in names or not names else list(dict.fromkeys(names))


def _fast_tier(prof, results, est, formats) -> dict | None:
    """The profile's fast tier (checkpoints in node memory) on each node, for DDP: whether it fits in the node
    memory the job has (the profile's mem), beside what the job offloads to the host; and, where FSDP or ZeRO is
    among the strategies, their bytes per node too (every rank writes its own shards or files: the node holds all
    of its ranks')."""
    if prof is None or not prof.fast_tier.enabled:
        return None
    ddp = next((r for r in results if r.strategy == "ddp"), None) or est.estimate(results[0].params // 2 or 1, "ddp")
    ranks = prof.gpus_per_node or prof.tasks_per_node or 1
    need = est.fast_tier_bytes(ddp, prof.fast_tier.replicas)
    mem = int(formats.parse_memory(prof.mem) * 2**20) if prof.mem else None
    out = est.fast_tier_fit(need, mem, beside=ddp.host * ranks)
    fsdp = next((r for r in results if r.strategy == "fsdp"), None)
    if fsdp is not None:
        out["fsdp_bytes_per_node"] = est.fast_tier_bytes(fsdp, prof.fast_tier.replicas) * ranks
    # DeepSpeed: every rank writes its optimizer partition and the module's state (its partition under ZeRO-3)
    zero = {r.strategy: est.fast_tier_bytes(r, prof.fast_tier.replicas) * ranks for r in results
            if r.strategy in ("zero1", "zero2", "zero3")}
    if zero:
        out["deepspeed_bytes_per_node"] = zero
    return out


def _strategy_flag_given(ctx: click.Context) -> str | None:
    """The first option given that only the strategies table reads: with --dtypes it would be silently ignored."""
    for param in ctx.command.params:
        given = ctx.get_parameter_source(param.name) != ParameterSource.DEFAULT
        if given and param.name not in ("model", "dtypes", "as_json"):
            return next(o for o in param.opts if o.startswith("--"))
    return None


def _print_dtypes(model: str, dtypes: list[str], as_json: bool) -> None:
    from hpc.cli.model_measure import measure
    from hpc.cluster import estimate as est

    size = measure(model)
    rows = est.dtype_sizes(size, dtypes)
    if as_json:
        echo_json({"model": model, "parameters": size.parameters, "largest_layers": size.largest_layers or None,
                   "dtypes": rows})
        return
    click.echo(f"{model}: {size.parameters:,} parameters; training with Adam is Accelerate's peak, not a sum")
    click.echo(table(["dtype", "largest layer", "total size", "training with Adam (peak)"],
                     [(r["dtype"], _size(r["largest_layer_bytes"]), _size(r["total_bytes"]),
                       _size(r["training_adam_peak_bytes"])) for r in rows]))
    click.echo(f"largest layer: {', '.join(size.largest_layers)}" if size.largest_layers else
               "largest layer: give a model folder or module:callable to see it")


@click.command("estimate-memory")
@click.argument("model")
@click.option("--strategy", "strategies", multiple=True, help="Only these (ddp, zero1/2/3, fsdp, ..._offload).")
@click.option("--precision", "--mixed-precision", type=click.Choice(["no", "bf16", "fp16"]), default="bf16",
              show_default=True)
@click.option("--world-size", type=int, help="GPUs in all (default: nodes x the profile's gpus_per_node).")
@click.option("-N", "--nodes", type=int, default=1, show_default=True)
@click.option("-p", "--profile", help="Take gpus_per_node and gpu_memory from this profile.")
@click.option("--gpu-memory", help="Memory of one GPU, e.g. 80G (default: the profile's gpu_memory).")
@click.option("--headroom", type=click.FloatRange(0, 0.9), default=0.1, show_default=True,
              help="Share of GPU memory kept free (CUDA context, allocator fragmentation, buffers).")
@click.option("--batch-size", type=int, help="Micro-batch per GPU (with --seq-len, --hidden-size, --layers).")
@click.option("--seq-len", type=int)
@click.option("--hidden-size", type=int)
@click.option("--layers", type=int)
@click.option("--heads", type=int, default=0,
              help="Count the attention scores too (5 x heads x seq_len^2 a layer): eager attention only; leave it "
                   "out for SDPA or flash attention, which never hold them whole.")
@click.option("--activation-checkpointing", is_flag=True)
@click.option("--tp", "--tp-size", "tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel ranks (ParallelismConfig tp_size): FSDP2 strategies, sharded over the rest.")
@click.option("--cp", "--cp-size", "cp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Context-parallel ranks (ParallelismConfig cp_size): each sequence is cut in cp parts, so "
                   "activations per rank divide by cp; FSDP2 shards the state over dp_shard x cp.")
@click.option("--pp", "--pp-degree", "pp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Pipeline stages (MegatronLMPlugin pp_degree): each rank holds 1/pp of the layers.")
@click.option("--dp-replicate", "--dp-replicate-size", "dp_replicate", type=click.IntRange(min=1), default=1,
              show_default=True, help="HSDP's replicas (ParallelismConfig dp_replicate_size).")
@click.option("--dtypes", multiple=True, is_flag=False, flag_value="all", metavar="[LIST]",
              help="Print Accelerate's table instead: per dtype (float32, float16, int8, int4; comma-separated or "
                   "repeated; bare: all) the largest layer, the total size and Adam's training peak.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def estimate_memory(ctx, model, strategies, precision, world_size, nodes, profile, gpu_memory, headroom, batch_size,
                    seq_len, hidden_size, layers, heads, activation_checkpointing, tp, cp, pp, dp_replicate, dtypes,
                    as_json):
    """Estimate training memory per GPU for MODEL: a parameter count (7B, 125M, 1.3e9), a local HuggingFace
    model folder (its config.json; needs transformers) or module:callable; models are built on the meta device.

    By default, a table of each strategy's bytes per GPU. --dtypes prints `accelerate estimate-memory`'s table
    instead (its own options only: MODEL, --dtypes, --json).

    \b
    Examples:
      hpc estimate-memory 7B --nodes 2 -p perlmutter
      hpc estimate-memory 1.3B --world-size 8 --gpu-memory 40G --batch-size 4 --seq-len 2048 \\
          --hidden-size 2048 --layers 24 --heads 16 --activation-checkpointing
      hpc estimate-memory mypkg.model:build --world-size 4 --json
      hpc estimate-memory 70B --world-size 64 --tp 8 --dp-replicate 2 --gpu-memory 80G
      hpc estimate-memory 70B --world-size 64 --tp 8 --pp 4 --gpu-memory 80G     # Megatron-LM's layout
      hpc estimate-memory 8B --world-size 16 --tp 2 --cp 4 --batch-size 1 --seq-len 262144 \\
          --hidden-size 4096 --layers 32 --activation-checkpointing --gpu-memory 80G
      hpc estimate-memory ./Llama-3.1-8B --dtypes float16,int4
    """
    if dtypes:
        flag = _strategy_flag_given(ctx)
        if flag:
            raise HpcError(f"{flag} is for the strategies table, which --dtypes replaces",
                           fix=f"drop {flag} or --dtypes")
        _print_dtypes(model, _dtype_list(dtypes), as_json)
        return
    from hpc.cli.model_measure import measure
    from hpc.cluster import estimate as est
    from hpc.slurm import formats

    capacity_text, gpus, prof = gpu_memory, None, None
    if profile:
        from hpc.cluster.config import profiles

        prof, _, _ = profiles.load(profile)
        gpus, capacity_text = prof.gpus_per_node or None, capacity_text or prof.gpu_memory
    if world_size is None:
        world_size = nodes * (gpus or 1)
    count = measure(model).parameters
    shape_args = (batch_size, seq_len, hidden_size, layers)
    shape = None
    if any(shape_args):
        if not all(shape_args):
            raise HpcError("the activation estimate needs --batch-size, --seq-len, --hidden-size and --layers",
                           fix="give all four, or none")
        shape = est.Shape(batch_size, seq_len, hidden_size, layers, heads, activation_checkpointing)
    meshed = tp > 1 or cp > 1 or dp_replicate > 1 or pp > 1
    names = strategies or (est.MESH_STRATEGIES if meshed else est.STRATEGIES)
    results = [est.estimate(count, s, precision=precision, world_size=world_size, shape=shape, tp=tp, cp=cp,
                            dp_replicate=dp_replicate, pp=pp) for s in names]
    capacity = int(formats.parse_memory(capacity_text) * 2**20 * (1 - headroom)) if capacity_text else None
    best = est.cheapest_fit(results, capacity) if capacity else None
    fast = _fast_tier(prof, results, est, formats)
    if as_json:
        echo_json({"parameters": count, "precision": precision, "world_size": world_size,
                   "usable_gpu_memory_bytes": capacity, "fits": best.strategy if best else None,
                   "strategies": [r.as_dict() for r in results], **({"fast_tier": fast} if fast else {})})
        return
    click.echo(f"{count:,} parameters, {precision}, {world_size} GPU(s), AdamW; GiB per GPU"
               + ("" if shape else " (no activations: give the model's shape for them)"))
    rows = [(r.strategy, _gib(r.params), _gib(r.grads), _gib(r.optimizer), _gib(r.activations), _gib(r.total),
             _gib(r.host), "" if capacity is None else ("yes" if r.total <= capacity else "no")) for r in results]
    click.echo(table(["strategy", "params", "grads", "optimizer", "activations", "total", "host", "fits"], rows))
    if capacity is not None:
        click.echo(f"cheapest that fits {capacity_text} (keeping {headroom:.0%} free): {best.strategy}" if best else
                   f"nothing fits {capacity_text}: add GPUs, shorten sequences or checkpoint activations")
    if fast:
        fits = "" if fast["node_memory_bytes"] is None else (
            f"; with the host's share of the job it {'fits' if fast['fits'] else 'does NOT fit'} the "
            f"profile's mem {prof.mem} per node" + ("" if fast["fits"] else " (the saves fall back to the shared "
                                                    f"tier: {est.FAST_TIER_FIX})"))
        click.echo(f"fast tier ({prof.fast_tier.directory}, replicas {prof.fast_tier.replicas}): "
                   f"{_gib(fast['bytes_per_node'])} GiB of node memory per node for ddp{fits}"
                   + (f"; {_gib(fast['fsdp_bytes_per_node'])} GiB for fsdp (every rank's shards)"
                      if "fsdp_bytes_per_node" in fast else "")
                   + "".join(f"; {_gib(n)} GiB for {name} (every rank's files)"
                             for name, n in fast.get("deepspeed_bytes_per_node", {}).items()))
