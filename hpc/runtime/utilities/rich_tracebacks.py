"""`accelerate.utils.rich` (bound as `accelerate.rich`): importing it installs rich's tracebacks, as Accelerate's
import does when rich is installed. hpc does it only when the module is asked for (hpc.rich, hpc.utils.rich):
`import hpc` stays light and leaves the process's excepthook alone."""

from hpc.runtime.availability import is_rich_available

if not is_rich_available():
    raise ModuleNotFoundError("To use the rich extension, install rich with `pip install rich`")

from rich.traceback import install  # noqa: E402

install(show_locals=False)
