"""Batch inference jobs: run a model over many items, each output written exactly once across preemptions."""
