"""Accelerate's own distributed test scripts (from its 1.15.0 wheel), with `accelerate` replaced by `hpc` in their
import lines and nothing else, pass on 2 real CPU ranks: every check their main() calls, on every rank.

The wheel is downloaded once with pip (it is only read: Accelerate is never installed or imported here).
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# what each script's main() calls on 2 CPU ranks (a check that stopped being reached would fail here)
EXPECTED = {
    "test_ops": {"test_gather", "test_gather_object", "test_gather_non_contiguous", "test_broadcast",
                 "test_pad_across_processes", "test_reduce_sum", "test_reduce_mean", "test_reduce_max",
                 "test_op_checker", "test_copy_tensor_to_devices"},
    "test_sync": {"test_dataloader_break", "test_distributed_sync", "test_distributed_sync_multiple_fwd",
                  "test_gradient_accumulation_with_opt_and_scheduler"},
    "test_script": {"init_state_check", "process_execution_check", "test_split_between_processes_list",
                    "test_split_between_processes_nested_dict", "test_split_between_processes_tensor",
                    "test_split_between_processes_evenly", "test_split_between_processes_dataset", "rng_sync_check",
                    "dl_preparation_check", "central_dl_preparation_check", "custom_sampler_check",
                    "check_seedable_sampler", "check_seedable_sampler_with_data_seed",
                    "check_seedable_sampler_in_batch_sampler_shard", "training_check", "training_check#2",
                    "test_trigger", "test_reinstantiated_state"},
    "test_distributed_data_loop": {"create_accelerator", "test_default_ensures_even_batch_sizes",
                                   "test_can_disable_even_batches", "test_can_join_uneven_inputs",
                                   "test_join_can_override_even_batches",
                                   "test_join_can_override_for_mixed_type_dataloaders",
                                   "test_join_raises_warning_for_iterable_when_overriding_even_batches",
                                   "test_join_raises_warning_for_non_ddp_distributed", "test_pickle_accelerator",
                                   "test_data_loader", "test_data_loader#2", "test_data_loader#3",
                                   "test_data_loader#4", "test_stateful_dataloader",
                                   "test_stateful_dataloader_save_state"},
}


def test_accelerates_distributed_test_scripts_pass_with_only_the_import_changed():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "accelerate_conformance.py"), "--json",
                          "--timeout", "240"], capture_output=True, text=True, cwd=ROOT, timeout=1500)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    by_script = {r["script"]: r for r in report["results"]}
    for script, expected in EXPECTED.items():
        result = by_script[script]
        failed = [f"{c['case']}: {c.get('error')}" for c in result["cases"] if not c["ok"]]
        assert not failed, f"{script} ({result['ended']}): {failed}\n{result['output_tail']}"
        assert {c["case"] for c in result["cases"]} == expected, result["output_tail"]
        assert result["ended"] == "exit 0", result["output_tail"]
    # the GPU-only script runs where GPUs are (scripts/gpu_smoke.sh), and is named as not run here
    assert set(report["not_run"]) <= {"test_ddp_comm_hook"}
