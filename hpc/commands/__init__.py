"""`accelerate.commands` as hpc spells it: the Python side of Accelerate's commands that scripts and tests call
(`merge.merge_command`, `launch.launch_command_parser`, `config` helpers, `estimate`, `env`), over hpc's own
commands (hpc/cli). Each module loads on import only; `hpc` itself stays torch-free."""
