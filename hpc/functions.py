"""Kept for jobs queued before the move: their program is `python -m hpc.functions`."""

import sys

from hpc.cluster.functions import (
    CALL_FILE,
    KEY_FILE,
    MODULE,
    SIGNED,
    FunctionFailed,
    main,
    new_key,
    pickle_call,
    read_result,
    result_ranks,
    sign,
    verified,
    write_key,
)

__all__ = ['CALL_FILE', 'FunctionFailed', 'KEY_FILE', 'MODULE', 'SIGNED', 'main', 'new_key', 'pickle_call', 'read_result', 'result_ranks', 'sign', 'verified', 'write_key']

if __name__ == "__main__":
    sys.exit(main())
