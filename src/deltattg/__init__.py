"""deltattg: step-level credit assignment for multi-turn LLM agents with a Token-to-Go progress meter.

Data flows one way (docs/concepts/data.md#data-flow):
    data (trajectories, labels) -> meter (train, score) -> credit (advantages) -> loss -> train
Environments and the rollout engine feed ``train`` and ``collect``.
"""

__version__ = "0.1.0"
