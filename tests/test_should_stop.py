"""should_stop runs no collective of its own: read on one rank only it returns at once, and a signal that reaches
one rank is seen by every rank at the same step (the ranks vote at their steps and collectives)."""

import json
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent("""
    import json, os, signal, sys, torch
    from hpc import Accelerator
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    first = acc.should_stop if acc.is_main_process else None   # one rank only: this used to hang the job
    seen = []
    for step in range(6):
        acc.backward(model(torch.ones(4, 2)).sum()); opt.step(); opt.zero_grad()
        if step == 2 and acc.process_index == 1:
            os.kill(os.getpid(), signal.SIGTERM)   # only rank 1 is told, after its step-2 vote
        seen.append(acc.should_stop)
    with open(f"{sys.argv[1]}/rank{acc.process_index}.json", "w") as f:  # two ranks' prints may interleave
        json.dump({"rank": acc.process_index, "first": first, "seen": seen}, f)
    acc.end_training()
""")


def test_should_stop_is_read_without_a_collective_and_agreed_at_the_next_step(tmp_path):
    (tmp_path / "w.py").write_text(WORKER)
    run = subprocess.run([sys.executable, "-m", "hpc", "launch", "--cpu", "--num_processes", "2",
                          str(tmp_path / "w.py"), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    outs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [o["first"] for o in outs] == [False, None]
    # rank 1's TERM after step 2 is in step 3's vote: both ranks see it there, not before
    assert outs[0]["seen"] == outs[1]["seen"] == [False, False, False, True, True, True]
