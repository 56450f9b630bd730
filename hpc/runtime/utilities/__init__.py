"""The rest of `accelerate.utils`: environment and version helpers, model helpers, FSDP files, probes and enums that
Accelerate's scripts import by name. hpc/utils/ re-exports them at Accelerate's paths."""
