"""Environments behind one protocol (``deltattg.envs.base``): built-in household, ALFWorld, BFCL multi-turn."""
