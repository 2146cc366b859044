"""Multi-turn episodes: prompts, policies (LM, noisy expert, random) and the batched rollout engine."""
