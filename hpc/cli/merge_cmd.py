"""`hpc merge-weights`: one weights file from a checkpoint. Imports torch only when it runs."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import click

from hpc.cli.output import echo_json
from hpc.errors import HpcError


@click.command("merge-weights")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="File to write (default: step-N.safetensors or step-N.pt beside the step folder).")
@click.option("--format", "fmt", type=click.Choice(["safetensors", "torch"]), default="safetensors", show_default=True)
@click.option("--model", "index", type=int, default=0, show_default=True,
              help="Which prepared model, for jobs that prepared several.")
@click.option("--trust-pickles", is_flag=True,
              help="Let the checkpoint's files be unpickled (needed for DeepSpeed's): only if you trust everyone "
                   "who can write the folder.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def merge_weights(checkpoint, output, fmt, index, trust_pickles, as_json):
    """Write the model weights of CHECKPOINT (a step-N folder, or a folder of them: the newest committed)
    as one file, whatever wrote it: DDP, FSDP (DCP shards, any world size) or DeepSpeed ZeRO 1-3.
    Checksums are verified first, and nothing is unpickled: a DeepSpeed checkpoint, whose reader unpickles
    its files, needs --trust-pickles.

    \b
    Examples:
      hpc merge-weights runs/checkpoints/step-1200 -o model.safetensors
      hpc merge-weights runs --format torch
    """
    from hpc.runtime.checkpoint import merge, safe_load

    if trust_pickles:  # the flag is the CLI's spelling of the runtime's opt-in
        os.environ[safe_load.TRUST_ENV] = "1"
    folder = merge.resolve(checkpoint)
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's reader prints its progress on stdout
        weights = merge.model_weights(folder, index)
    if not weights:
        raise HpcError(f"{folder}: model {index} has no weights", fix="check --model")
    out = output or folder.with_name(folder.name + (".safetensors" if fmt == "safetensors" else ".pt"))
    merge.write(weights, out, fmt)
    numel = sum(t.numel() for t in weights.values())
    if as_json:
        echo_json({"checkpoint": str(folder), "output": str(out), "format": fmt, "tensors": len(weights),
                   "parameters": numel})
    else:
        click.echo(f"{out}: {len(weights)} tensors, {numel:,} parameters from {folder}")
