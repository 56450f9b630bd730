"""Vetting: each node of a job checks itself and its network before the ranks start (hpc.runtime.vetting.probe);
the batch script then starts the job on the best nodes (hpc.runtime.vetting.select)."""
