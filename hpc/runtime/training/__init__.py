"""The training loop's pieces the Accelerator delegates to: prepare() (preparation.py), the optimizer and scheduler
wrappers, LocalSGD, and finding a batch size that fits."""
