"""Continuous-batching simulation over the block pool: scheduler, policies, step time, metrics."""
