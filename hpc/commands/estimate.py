"""`accelerate.commands.estimate` (`accelerate estimate-memory`): a model's size per dtype and what training it
with Adam takes, over `hpc estimate-memory`'s measuring (a local model folder, a module:callable, or a parameter
count such as 7B; hpc reads no Hub: download a model's config.json first)."""

from __future__ import annotations

import argparse

from hpc.commands.utils import CustomArgumentParser

DTYPES = ["float32", "float16", "int8", "int4"]


def create_empty_model(model_name: str, library_name: str | None = None, trust_remote_code: bool = False,
                       access_token: str | None = None):
    """The model built without memory (meta device) from a local folder's config.json, or a module:callable."""
    from hpc.runtime.big_models.model_shapes import build_from_callable, build_from_folder

    if library_name == "timm":
        raise ValueError("hpc builds transformers models (a folder with config.json) or a module:callable, "
                         "not timm's")
    return build_from_callable(model_name) if ":" in model_name else build_from_folder(model_name)


def create_ascii_table(headers: list, rows: list, title: str) -> str:
    """A boxed table (Accelerate's look), every cell a string."""
    widths = [max(len(str(row[i])) for row in [*rows, headers]) for i in range(len(headers))]
    inner = sum(widths) + len(widths) - 1
    if len(title) > inner:
        widths[-1] += len(title) - inner
        inner = len(title)

    def line(left, middle, right):
        return left + middle.join("─" * w for w in widths) + right

    def row(cells):
        return "│" + "│".join(str(c).center(w) for c, w in zip(cells, widths)) + "│"

    return "\n".join(["┌" + "─" * inner + "┐", "│" + title.center(inner) + "│", line("├", "┬", "┤"), row(headers),
                      line("├", "┼", "┤"), *(row(r) for r in rows), line("└", "┴", "┘")])


def estimate_command_parser(subparsers=None):
    description = "Model size estimator for fitting a model onto device memory."
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", description=description)
    else:
        parser = CustomArgumentParser(description=description)
    parser.add_argument("model_name", type=str, help="A local model folder, a module:callable, or a count (7B).")
    parser.add_argument("--library_name", type=str, choices=["timm", "transformers"],
                        help="The library the model has an integration with.")
    parser.add_argument("--dtypes", type=str, nargs="+", default=list(DTYPES), choices=DTYPES,
                        help="The dtypes to use for the model.")
    parser.add_argument("--trust_remote_code", action="store_true", default=False,
                        help="Allow custom modeling code shipped with the model (only for models you trust).")
    if subparsers is not None:
        parser.set_defaults(func=estimate_command)
    return parser


def estimate_training_usage(bytes: int, mixed_precision: str, msamp_config: str | None = None) -> dict:  # noqa: A002
    """Training memory for a batch of one, by stage, from the fp32 size ``bytes`` (Accelerate's arithmetic):
    float32 keeps weights, gradients and both Adam moments (the step, 4x); fp16/bf16 mixed precision adds half-size
    gradients. -1 where a dtype is not trained (int8, int4)."""
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    if mixed_precision == "float32":
        sizes.update(model=bytes, gradients=bytes, optimizer=2 * bytes, step=4 * bytes)
    elif mixed_precision in ("float16", "bfloat16") or (mixed_precision == "fp8" and msamp_config is None):
        sizes.update(model=bytes, gradients=bytes + bytes // 2, optimizer=2 * bytes, step=2 * bytes)
    return sizes


def gather_data(args: argparse.Namespace) -> list[list]:
    """[dtype, largest layer bytes (None for a bare count), total bytes, training by stage] per dtype asked."""
    from hpc.cli.model_measure import measure
    from hpc.cluster.estimate import dtype_sizes

    size = measure(args.model_name)
    return [[row["dtype"], row["largest_layer_bytes"], row["total_bytes"],
             estimate_training_usage(size.total_bytes, row["dtype"])] for row in dtype_sizes(size, args.dtypes)]


def estimate_command(args: argparse.Namespace) -> str:
    from hpc.runtime.utilities.models import convert_bytes

    rows = []
    for dtype, layer, total, training in gather_data(args):
        peak = max(training.values())
        rows.append([dtype, "N/A" if layer is None else convert_bytes(layer), convert_bytes(total),
                     convert_bytes(peak) if peak != -1 else "N/A"])
    table = create_ascii_table(["dtype", "Largest Layer", "Total Size", "Training using Adam"], rows,
                               f"Memory Usage for loading `{args.model_name}`")
    print(table)
    return table


def main() -> None:
    estimate_command(estimate_command_parser().parse_args())


if __name__ == "__main__":
    main()
