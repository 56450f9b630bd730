"""prepare(dataloader) on real ranks: rank 0 reading and sending, generators synchronised. The loaders and the
in-process cases are tests/unit/test_data_loading.py; this file is its own worker, in one 2-rank launch:

    python -m hpc launch --nproc 2 tests/test_data_loading.py OUT_DIR
"""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from hpc.runtime.configuration import DataLoaderConfiguration
from tests.unit.test_data_loading import MAKERS, Stream


# --- real ranks ----------------------------------------------------------------------------------------
def test_on_two_real_ranks_dispatch_and_generator_sync(tmp_path):
    from tests.jobhelpers import launch_env

    proc = subprocess.run([sys.executable, "-m", "hpc", "launch", "--nproc", "2", __file__, str(tmp_path)],
                          cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for case in ("map dispatch", "stream dispatch", "generator"):
        alone = [i for b in ranks[0][case + " alone"] for i in b]
        assert [i for r in itertools.zip_longest(*(x[case] for x in ranks)) for b in r if b for i in b] == alone
    assert ranks[0]["stream gathered"] == list(range(22))
    assert ranks[0]["split dispatch"] == [[0, 1], [4, 5], [8, 9]] and ranks[1]["split dispatch"] == [[2, 3], [6, 7]]


def _two_rank_worker(out: Path) -> None:
    from hpc import Accelerator

    acc = Accelerator(cpu=True)
    rank, got = acc.process_index, {}

    def run(name, make, **config):
        acc.dataloader_config = DataLoaderConfiguration(**config)
        got[name] = [b.tolist() for b in acc.prepare(make())]
        got[name + " alone"] = [b.tolist() for b in make()]

    run("map dispatch", MAKERS["reversed sampler"], dispatch_batches=True, even_batches=False)
    run("stream dispatch", lambda: DataLoader(Stream(22), batch_size=4), even_batches=False)
    run("split dispatch", lambda: DataLoader(Stream(10), batch_size=4), split_batches=True, even_batches=False)
    # each rank seeds its generator differently: rank 0's wins, as in one process seeded like rank 0
    run("generator", lambda: DataLoader(torch.arange(23), batch_size=3, shuffle=True,
                                        generator=torch.Generator().manual_seed(5 + rank)), even_batches=False)
    got["generator alone"] = [b.tolist() for b in DataLoader(torch.arange(23), batch_size=3, shuffle=True,
                                                             generator=torch.Generator().manual_seed(5))]
    acc.dataloader_config = DataLoaderConfiguration()
    got["stream gathered"] = [i for b in acc.prepare(DataLoader(Stream(22), batch_size=4))
                              for i in acc.gather_for_metrics(b).tolist()]
    (out / f"rank{rank}.json").write_text(json.dumps(got))
    acc.end_training()


if __name__ == "__main__":
    _two_rank_worker(Path(sys.argv[1]))
