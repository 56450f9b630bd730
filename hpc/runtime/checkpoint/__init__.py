"""Checkpoints: atomic, checksummed, sharded or whole, synchronous or in the background."""
