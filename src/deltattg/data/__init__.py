"""Trajectories, their JSONL format, token counting and Token-to-Go labels."""
