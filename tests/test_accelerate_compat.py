"""An Accelerate user's config templates, variables and flags in real training processes (`hpc launch`, the
on-machine SLURM). Reading, rendering and `hpc config` are tests/unit/test_accelerate_compat.py."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.unit.test_accelerate_compat import hpc, write_templates

# --- in the job ---------------------------------------------------------------------------------------

TRAIN = textwrap.dedent("""
    import json, os, sys
    import torch
    from hpc import Accelerator

    class BertLayer(torch.nn.Module):  # the block class Accelerate's fsdp.yaml names
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
        def forward(self, x):
            return torch.relu(self.lin(x))

    acc = Accelerator()
    torch.manual_seed(acc.process_index)  # different weights per rank: sync_module_states must fix that
    class Net(torch.nn.Sequential):
        _no_split_modules = ["BertLayer"]  # as a transformers model says which blocks FSDP may wrap

    model = Net(BertLayer(), BertLayer(), torch.nn.Linear(8, 1))
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    plugin = acc.strategy.plugin
    first = {n: p.full_tensor() if hasattr(p, "full_tensor") else p for n, p in model.named_parameters()}
    gathered = acc.gather(torch.cat([t.detach().reshape(-1) for t in first.values()]).reshape(1, -1))
    for step in range(2):
        with acc.accumulate(model):
            loss = model(torch.ones(4, 8) * (step + 1)).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    if acc.is_main_process:
        json.dump({"world": acc.num_processes, "precision": acc.mixed_precision, "kind": acc.distributed_type,
                   "sharding": plugin.sharding_strategy, "wrap": plugin.auto_wrap_policy,
                   "sync": plugin.sync_module_states, "ranks_equal": bool((gathered[0] == gathered[1]).all()),
                   "equal_to_rank0_init": bool(torch.equal(gathered[0], torch.cat([b.reshape(-1) for b in before])))},
                  open(sys.argv[1], "w"))
""")


def test_hpc_launch_runs_accelerates_fsdp_template_unchanged(tmp_path):
    configs = write_templates(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    proc = hpc(tmp_path, "launch", "--config_file", str(configs / "fsdp.yaml"), "train.py", str(tmp_path / "out.json"),
               timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out == {"world": 2, "precision": "bf16", "kind": "FSDP", "sharding": "FULL_SHARD",
                   "wrap": "TRANSFORMER_AUTO_WRAP", "sync": True, "ranks_equal": True, "equal_to_rank0_init": True}


PROBE = textwrap.dedent("""
    import json, os, sys
    import torch
    from hpc import Accelerator
    acc = Accelerator()
    model = acc.prepare(torch.nn.Linear(2, 2))
    out = {"precision": acc.mixed_precision, "steps": acc.gradient_accumulation_steps, "cpu": acc.state.device.type,
           "debug": acc.debug, "compiled": getattr(model, "_compiled_call_impl", None) is not None}
    if acc.num_processes > 1:
        try:
            acc.gather(torch.zeros(acc.process_index + 1))
        except Exception as e:
            out["gather_error"] = str(e)
    if acc.is_main_process:
        json.dump(out, open(sys.argv[1], "w"))
""")


def test_accelerate_variables_are_honoured_below_hpcs_own(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    env = {"ACCELERATE_MIXED_PRECISION": "fp16", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3",
           "ACCELERATE_USE_CPU": "true", "ACCELERATE_DYNAMO_BACKEND": "EAGER"}
    proc = subprocess.run([sys.executable, "probe.py", "plain.json"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "plain.json").read_text()) == {
        "precision": "fp16", "steps": 3, "cpu": "cpu", "debug": False, "compiled": True}
    # in an hpc job the runtime config (profile, job file, flags) is above them
    (tmp_path / "runtime.json").write_text(json.dumps({"version": 2, "mixed_precision": "bf16",
                                                       "hang_timeout": 0}))
    proc = subprocess.run([sys.executable, "probe.py", "job.json"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **env, "HPC_RUNTIME_CONFIG": str(tmp_path / "runtime.json")}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "job.json").read_text())["precision"] == "bf16"


def test_debug_flag_names_the_shapes_that_would_hang_a_gather(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    proc = hpc(tmp_path, "launch", "--num_processes", "2", "--debug", "--mixed_precision", "bf16",
               "probe.py", str(tmp_path / "out.json"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["debug"] is True and out["precision"] == "bf16"
    assert "gather: the ranks hold different shapes (rank 0: (1,); rank 1: (2,))" in out["gather_error"]


def test_fp8_on_a_device_without_fp8_tensor_cores_is_a_clear_error_in_the_job(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    proc = subprocess.run([sys.executable, "probe.py", "x.json"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "ACCELERATE_MIXED_PRECISION": "fp8"}, timeout=120)
    assert proc.returncode != 0 and "its matmuls need a GPU with fp8 tensor cores" in proc.stderr
    assert "this process runs on cpu" in proc.stderr


HELLO = textwrap.dedent("""
    import json, os, socket, sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"world": dist.get_world_size(), "sum": t.item(), "host": socket.gethostname(),
                   "omp": os.environ.get("OMP_NUM_THREADS")}, f)
    dist.destroy_process_group()
""")


@pytest.mark.slurm
def test_accelerates_slurm_multinode_script_with_hpc_in_place_of_accelerate(slurm, tmp_path):
    """examples/slurm/submit_multinode.sh of Accelerate, with `accelerate launch` replaced by `hpc launch`."""
    (tmp_path / "hello.py").write_text(HELLO)
    (tmp_path / "out").mkdir()
    script = tmp_path / "job.sbatch"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH -N 2 --ntasks-per-node=1 --cpus-per-task=2 --time=2
        export GPUS_PER_NODE=2
        head_node_ip=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
        export LAUNCHER="{sys.executable} -m hpc launch \\
            --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) \\
            --num_machines $SLURM_NNODES \\
            --rdzv_backend c10d \\
            --main_process_ip $head_node_ip \\
            --main_process_port 29517 \\
            --num_cpu_threads_per_process 2 \\
            "
        srun $LAUNCHER hello.py {tmp_path / 'out'}
        echo "first: $?"
        srun {sys.executable} -m hpc launch --num_processes 4 --num_machines 2 --machine_rank 5 hello.py {tmp_path}
        echo "second: $?"
        """))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPC_", "ACCELERATE_", "SLURM_JOB"))}
    job = subprocess.run(["sbatch", "--parsable", "--wait", f"--chdir={tmp_path}", f"--output={tmp_path}/out.log",
                          str(script)], env={**env, "HF_HOME": str(tmp_path / "hf")}, capture_output=True,
                         text=True, timeout=240)
    log = (tmp_path / "out.log").read_text()
    ranks = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("rank*.json"))]
    assert len(ranks) == 4 and {r["world"] for r in ranks} == {4} and {r["sum"] for r in ranks} == {6.0}, log
    assert (sorted(r["host"] for r in ranks) == ["node1", "node1", "node2", "node2"]
            and {r["omp"] for r in ranks} == {"2"})
    assert "first: 0" in log and "second: 2" in log, log
    assert "machine_rank 5 (a flag or the config file), but SLURM says 0 (SLURM_NODEID)" in log, log
    assert "hpc: note" not in log  # checked against SLURM, so nothing to explain
    assert job.returncode == 0, job.stderr


def test_torch_dynamo_plugin_compiles_in_place(tmp_path):
    script = textwrap.dedent("""
        import json, sys, torch
        from hpc import Accelerator
        from hpc.utils import TorchDynamoPlugin
        acc = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
        model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)]))
        names = [n for n, _ in model.named_parameters()]
        model = acc.prepare(model)
        blocks = [b._compiled_call_impl is not None for b in model[0]]
        json.dump({"blocks": blocks, "whole": model._compiled_call_impl is not None,
                   "names_kept": [n for n, _ in model.named_parameters()] == names}, open(sys.argv[1], "w"))
    """)
    (tmp_path / "t.py").write_text(script)
    proc = subprocess.run([sys.executable, "t.py", "out.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "out.json").read_text()) == {"blocks": [True, True], "whole": False,
                                                               "names_kept": True}
