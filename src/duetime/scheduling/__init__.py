"""Scheduling: the per-model queue, the batch policy, and the loop-side driver."""
