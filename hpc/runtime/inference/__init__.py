"""Inference over the job's ranks: pipeline stages (pipeline.py, Accelerate's prepare_pippy) and batch inference
in committed chunks (batch/, `hpc.inference.BatchInference`)."""
