"""`accelerate.commands.merge` (`accelerate merge-weights`): one weights file from sharded weights. Given a DCP
folder (what save_fsdp_model writes for SHARDED_STATE_DICT) it is merge_fsdp_weights, as in Accelerate; given an
hpc checkpoint (a step-N folder save_state committed, or a folder of them) it is `hpc merge-weights`, verified
against the checkpoint's checksums first."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpc.commands.utils import CustomArgumentParser

description = """Utility to merge the weights from multiple FSDP checkpoints into a single combined checkpoint.
Should be used if `SHARDED_STATE_DICT` was used for the model (or name an hpc step-N checkpoint folder). Weights
will be saved to `{output_path}`.

This is a CPU-bound process and requires enough RAM to load the entire model state dict."""


def _is_hpc_checkpoint(folder: Path) -> bool:
    from hpc.runtime.checkpoint import manifest

    return manifest.read(folder) is not None or (folder / "checkpoints").is_dir() or \
        any(p.name.startswith("step-") for p in folder.glob("step-*"))


def merge_command(args: argparse.Namespace) -> None:
    folder = Path(args.checkpoint_directory)
    safe = not args.unsafe_serialization
    if (folder / ".metadata").is_file() or not _is_hpc_checkpoint(folder):
        from hpc.utils import merge_fsdp_weights

        merge_fsdp_weights(args.checkpoint_directory, args.output_path, safe, args.remove_checkpoint_dir)
        return
    from hpc.runtime.checkpoint import merge
    from hpc.utils import SAFE_WEIGHTS_NAME, WEIGHTS_NAME

    step = merge.resolve(folder)
    out = Path(args.output_path)
    out.mkdir(parents=True, exist_ok=True)
    merge.write(merge.model_weights(step), out / (SAFE_WEIGHTS_NAME if safe else WEIGHTS_NAME),
                "safetensors" if safe else "torch")
    if args.remove_checkpoint_dir:
        raise SystemExit("hpc: --remove_checkpoint_dir is refused for an hpc checkpoint: its folders are kept and "
                         "purged by save_state's own rules (fix: delete the step folder yourself)")


def merge_command_parser(subparsers=None):
    if subparsers is not None:
        parser = subparsers.add_parser("merge-weights", description=description)
    else:
        parser = CustomArgumentParser(description=description)
    parser.add_argument("checkpoint_directory", type=str,
                        help="A directory containing sharded weights saved by FSDP (or an hpc checkpoint).")
    parser.add_argument("output_path", type=str, help="The path to save the merged weights.")
    parser.add_argument("--unsafe_serialization", action="store_true", default=False,
                        help="Save the merged weights as `.bin` rather than `.safetensors` (not recommended).")
    parser.add_argument("--remove_checkpoint_dir", action="store_true", default=False,
                        help="Remove the checkpoint directory after merging.")
    if subparsers is not None:
        parser.set_defaults(func=merge_command)
    return parser


def main() -> None:
    merge_command(merge_command_parser().parse_args())


if __name__ == "__main__":
    main()
