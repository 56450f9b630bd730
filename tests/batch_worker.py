"""A batch-inference job for the tests: item i's output is a function of i alone; every commit is noted in a
ledger (one O_APPEND line per commit: attempt, rank, host, chunk), so a test sees which attempt did what.

    python batch_worker.py '{"out": ..., "items": 400, "chunk_size": 8, "sleep": 0.1, "ledger": ...}'
"""

import json
import os
import socket
import sys
import time

from hpc import PartialState
from hpc.inference import BatchInference


def output(i: int) -> dict:
    return {"i": i, "square": i * i, "text": f"item-{i}"}


def main(spec: dict) -> None:
    state = PartialState()
    job = BatchInference(spec["out"], num_items=spec["items"], chunk_size=spec["chunk_size"],
                         format=spec.get("format", "jsonl"))
    attempt = os.environ.get("SLURM_RESTART_COUNT") or os.environ.get("HPC_RESTART_COUNT") or "0"
    for chunk in job:
        if int(attempt) < spec.get("sleep_attempts", 1 << 30):
            time.sleep(spec.get("sleep", 0))
        chunk.commit([output(i) for i in chunk.indices])
        if spec.get("ledger"):
            line = f"{attempt} {state.process_index} {socket.gethostname()} {chunk.number}\n"
            fd = os.open(spec["ledger"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.write(fd, line.encode())
            os.close(fd)
    print(json.dumps({"rank": state.process_index, **job.finish()}), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
