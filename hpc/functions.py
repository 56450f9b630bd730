"""Kept for jobs queued before the move: their ranks run `python -m hpc.functions`."""

import sys

from hpc.cluster.functions import FunctionFailed, pickle_call, read_result, result_ranks, write_key
from hpc.contract.function_files import CALL_FILE, KEY_FILE, MODULE, SIGNED, new_key, sign, verified
from hpc.runtime.function_runner import main

__all__ = ["CALL_FILE", "FunctionFailed", "KEY_FILE", "MODULE", "SIGNED", "main", "new_key", "pickle_call",
           "read_result", "result_ranks", "sign", "verified", "write_key"]

if __name__ == "__main__":
    sys.exit(main())
