"""`hpc submit --launcher deepspeed` on the on-machine SLURM: DeepSpeed's slurm runner starts the ranks with srun."""

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import SLURM_LOCAL
from tests.jobhelpers import hpc, status, submit

pytestmark = pytest.mark.slurm

# Each rank joins a gloo group from the standard variables alone (env://, as deepspeed.init_distributed would)
# and sums rank + 1 over the world. The file name cannot collide even if two processes think they are rank 0.
RANKS = textwrap.dedent("""
    import json, os, socket
    from datetime import timedelta
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    total = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(total)
    seen = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "local_rank": int(os.environ["LOCAL_RANK"]),
            "host": socket.gethostname(), "master": os.environ["MASTER_ADDR"], "sum": total.item()}
    with open(os.path.join(os.environ["DUMP_DIR"], "%s-%d.json" % (seen["host"], os.getpid())), "w") as f:
        json.dump(seen, f)
    print("rank", seen["rank"], "all_reduce", seen["sum"], flush=True)
    dist.destroy_process_group()
""")


@pytest.fixture
def project(slurm, tmp_path):
    (tmp_path / "dumps").mkdir()
    (tmp_path / "ranks.py").write_text(RANKS)
    return tmp_path


def test_deepspeed_launcher_runs_four_ranks_on_two_nodes(project):
    # Rank variables left in the submitting environment (an in-process Accelerator exports them) travel
    # through sbatch and srun to every rank: the job must replace them, not leave each rank a world of its own.
    leaked = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0"}
    info = submit(project, "-p", "slurm-local", "-N", "2", "--launcher", "deepspeed", "ranks.py", env=leaked)
    if hpc(project, "wait", info["job_id"], timeout=300).returncode != 0:
        pytest.fail("the job failed:\n" + hpc(project, "logs", "--all", info["job_id"]).stdout[-4000:])
    ranks = sorted((json.loads(p.read_text()) for p in (project / "dumps").glob("*.json")), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"]) for r in ranks] == [(0, 4), (1, 4), (2, 4), (3, 4)], ranks
    first, second = ranks[0]["host"], ranks[2]["host"]
    assert first != second
    assert [(r["host"], r["local_rank"]) for r in ranks] == [(first, 0), (first, 1), (second, 0), (second, 1)]
    assert {r["master"] for r in ranks} == {first}  # the first host of the allocation
    assert {r["sum"] for r in ranks} == {1 + 2 + 3 + 4}
    st = status(project, info["job_id"])
    assert (st["state"], st["exit_code"]) == ("COMPLETED", 0), st
    job = Path(info["job_dir"])
    for rank in range(4):  # a log per rank, as with the srun launcher
        assert f"rank {rank} all_reduce 10.0" in (job / "logs" / f"rank{rank}-{info['job_id']}.out").read_text()
    # each task noted how it ended: what the batch script's lost-node check goes by
    ends = {p.name: p.read_text().strip() for p in (job / "tasks").glob("0.end.*")}
    assert ends == {f"0.end.{r['host']}.{r['rank']}": "0" for r in ranks}


def test_deepspeed_launcher_starts_on_the_nodes_vetting_chose_and_the_spare_goes_back(project):
    """One spare and a bad node: the runner's hostfile and srun hold the two nodes vetting chose, the bad one goes
    back to the cluster, and the ranks form one world of four."""
    subprocess.run([str(SLURM_LOCAL), "bad-node", "node2"], check=True, capture_output=True, timeout=60)
    try:
        info = submit(project, "-p", "slurm-local", "-N", "2", "--spare-nodes", "1", "--set", "vet=true",
                      "--launcher", "deepspeed", "ranks.py")
        done = hpc(project, "wait", info["job_id"], timeout=300)
        logs = hpc(project, "logs", "--all", info["job_id"]).stdout
        assert done.returncode == 0, logs[-4000:]
    finally:
        subprocess.run([str(SLURM_LOCAL), "good-node", "node2"], capture_output=True, timeout=60)
    ranks = [json.loads(p.read_text()) for p in (project / "dumps").glob("*.json")]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3] and {r["world_size"] for r in ranks} == {4}, ranks
    assert {r["host"] for r in ranks} == {"node1", "node3"} and {r["sum"] for r in ranks} == {10}, ranks
    assert "vetting: released node(s) node2 to the cluster" in logs, logs
