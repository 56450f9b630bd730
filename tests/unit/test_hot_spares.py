"""Hot spares in one process: which node replaced which, read off the timeline's `started` lines (what `hpc status`
prints), and the store-based host list rank 0 writes there. (On SLURM: tests/test_elastic_slurm.py.)"""

import json

from hpc.cluster.backends.base import LocalFiles, replaced_nodes
from hpc.contract import timeline


def _line(event: str, attempt: int = 0, **fields) -> str:
    return json.dumps({"t": 1.0, "attempt": attempt, "event": event, **fields}) + "\n"


def test_a_spare_that_took_a_lost_nodes_place_is_named_with_the_step_it_resumed_at():
    events = timeline.parse(
        _line("started", hosts=["node1", "node2"], step=0) + _line("progress", step=12)
        + _line("started", hosts=["node1", "node3"], step=0) + _line("resumed", step=10)
        + _line("started", hosts=["node1"], step=0)  # no spare left: the world shrank, nothing replaced
        + _line("started", attempt=1, hosts=["node4", "node5"], step=0)  # a requeue's new nodes are no spares
        + _line("started", attempt=1, hosts=["node4", "node6"], step=20))  # no resumed line: the started step
    assert timeline.replacements(events) == [{"lost": "node2", "by": "node3", "step": 10, "attempt": 0},
                                             {"lost": "node5", "by": "node6", "step": 20, "attempt": 1}]
    # lines of an older hpc (no hosts) replace nothing
    assert timeline.replacements(timeline.parse(_line("started", step=0) + _line("started", step=3))) == []


def test_status_reads_the_replacements_of_each_task(tmp_path):
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "0.timeline").write_text(
        _line("started", hosts=["a", "b"], step=0) + _line("started", hosts=["a", "c"], step=5))
    assert replaced_nodes(LocalFiles(tmp_path)) == [{"lost": "b", "by": "c", "step": 5, "attempt": 0, "task": "0"}]
