"""Checkpoint tiers: the fast tier in node memory (node_store, writer, replication) and the resume choice across
tiers (choice). The shared tier is the checkpointer's own store; the run guard wires them (resilience/fast_tier)."""
