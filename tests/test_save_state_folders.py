"""save_state into a folder the script names: saving there again replaces the checkpoint (the newest state is
what loads), a crash between the swap's two renames loses neither, and the pre-hooks see what is saved/loaded."""

import json
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent("""
    import json, os, sys, torch
    from pathlib import Path
    from hpc import Accelerator
    root = Path(sys.argv[1])
    acc = Accelerator(cpu=True, project_dir=str(root))
    model = torch.nn.Linear(1, 1, bias=False)
    model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=1.0))
    seen = []
    handle = acc.register_save_state_pre_hook(
        lambda models, weights, folder: seen.append(["save", len(models), float(weights[0]["weight"]), folder]))
    acc.register_load_state_pre_hook(lambda models, folder: seen.append(["load", len(models), folder]))

    def set_weight(value):
        with torch.no_grad():
            model.weight.fill_(value)

    for value in (1.0, 2.0, 3.0):   # no optimizer step in between: the same step number every time
        set_weight(value)
        acc.save_state(root / "latest")
    handle.remove()
    set_weight(4.0)
    acc.save_state(root / "latest")
    set_weight(99.0)
    acc.load_state(root / "latest")
    out = {"loaded": model.weight.item(), "seen": seen, "left": sorted(os.listdir(root))}
    # a crash after the old folder was moved aside and before the new one took its place
    (root / "latest").rename(root / ".latest.saving")
    set_weight(99.0)
    acc.load_state(root / "latest")
    out["after_cut_swap"] = model.weight.item()
    print(json.dumps(out))
""")


def test_saving_to_the_same_folder_again_replaces_it_and_hooks_run(tmp_path):
    (tmp_path / "w.py").write_text(WORKER)
    run = subprocess.run([sys.executable, str(tmp_path / "w.py"), str(tmp_path / "proj")], capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["loaded"] == 4.0  # the last save, not the first (it used to be kept: a silent loss of work)
    assert out["after_cut_swap"] == 4.0
    assert out["left"] == ["latest"]  # nothing of the swaps left beside it
    folder = str(tmp_path / "proj")
    saves = [s for s in out["seen"] if s[0] == "save"]
    # each save's hook saw the state being saved and the folder being written (beside "latest" once it exists)
    assert [s[2] for s in saves] == [1.0, 2.0, 3.0]
    assert saves[0][3] == f"{folder}/latest" and saves[1][3] == f"{folder}/.latest.saving"
    assert out["seen"][-1] == ["load", 1, f"{folder}/latest"]
