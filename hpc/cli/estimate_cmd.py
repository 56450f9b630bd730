"""`hpc estimate-memory`: bytes per GPU per strategy, and the cheapest strategy that fits. Torch-free
unless a model (module:callable) is given."""

from __future__ import annotations

import click

from hpc.cli.output import echo_json, table
from hpc.errors import HpcError


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


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
@click.option("--heads", type=int, default=0)
@click.option("--activation-checkpointing", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def estimate_memory(model, strategies, precision, world_size, nodes, profile, gpu_memory, headroom, batch_size, seq_len,
                    hidden_size, layers, heads, activation_checkpointing, as_json):
    """Estimate training memory per GPU for MODEL: a parameter count (7B, 125M, 1.3e9) or module:callable,
    built on the meta device.

    \b
    Examples:
      hpc estimate-memory 7B --nodes 2 -p perlmutter
      hpc estimate-memory 1.3B --world-size 8 --gpu-memory 40G --batch-size 4 --seq-len 2048 \\
          --hidden-size 2048 --layers 24 --heads 16 --activation-checkpointing
      hpc estimate-memory mypkg.model:build --world-size 4 --json
    """
    from hpc import estimate as est
    from hpc.slurm import formats

    capacity_text, gpus = gpu_memory, None
    if profile:
        from hpc.config import profiles

        prof, _, _ = profiles.load(profile)
        gpus, capacity_text = prof.gpus_per_node or None, capacity_text or prof.gpu_memory
    if world_size is None:
        world_size = nodes * (gpus or 1)
    count = est.count_parameters(model) if ":" in model else est.parse_count(model)
    shape_args = (batch_size, seq_len, hidden_size, layers)
    shape = None
    if any(shape_args):
        if not all(shape_args):
            raise HpcError("the activation estimate needs --batch-size, --seq-len, --hidden-size and --layers",
                           fix="give all four, or none")
        shape = est.Shape(batch_size, seq_len, hidden_size, layers, heads, activation_checkpointing)
    names = strategies or est.STRATEGIES
    results = [est.estimate(count, s, precision=precision, world_size=world_size, shape=shape) for s in names]
    capacity = int(formats.parse_memory(capacity_text) * 2**20 * (1 - headroom)) if capacity_text else None
    best = est.cheapest_fit(results, capacity) if capacity else None
    if as_json:
        echo_json({"parameters": count, "precision": precision, "world_size": world_size,
                   "usable_gpu_memory_bytes": capacity, "fits": best.strategy if best else None,
                   "strategies": [r.as_dict() for r in results]})
        return
    click.echo(f"{count:,} parameters, {precision}, {world_size} GPU(s), AdamW; GiB per GPU"
               + ("" if shape else " (no activations: give the model's shape for them)"))
    rows = [(r.strategy, _gib(r.params), _gib(r.grads), _gib(r.optimizer), _gib(r.activations), _gib(r.total),
             _gib(r.host), "" if capacity is None else ("yes" if r.total <= capacity else "no")) for r in results]
    click.echo(table(["strategy", "params", "grads", "optimizer", "activations", "total", "host", "fits"], rows))
    if capacity is not None:
        click.echo(f"cheapest that fits {capacity_text} (keeping {headroom:.0%} free): {best.strategy}" if best else
                   f"nothing fits {capacity_text}: add GPUs, shorten sequences or checkpoint activations")
