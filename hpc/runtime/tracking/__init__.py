"""What the run tells: the trackers (trackers.py: JSONL, TensorBoard, W&B, ...), the ones a run started
(run_trackers.py), the main-process logger (rank_logging.py) and what a rank holds in tensors (memory_snapshot.py)."""
