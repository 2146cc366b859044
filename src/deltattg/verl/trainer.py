"""verl's synchronous v1 trainer with deltattg's step-level credit: ``trainer.v1.trainer_mode=deltattg``.

Everything is verl's ``PPOTrainerSync`` except the advantage step, which first fetches each row's ``extra_fields``
(written by :mod:`deltattg.verl.agent_loop`) from the TransferQueue for the batch's keys, then runs verl's own
advantage step (KL in reward, rollout correction, write-back) inside a :func:`~deltattg.verl.estimators.step_context`,
so that the registered estimator sees each row's episode and step. Rows are matched by their keys, never by
position: ``_balance_batch`` has already reordered them and added padding rows. The frozen meter is loaded once, in
the trainer's process, from ``algorithm.deltattg`` (:class:`~deltattg.verl.credit.VerlSettings`).
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from omegaconf import OmegaConf, open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from deltattg.verl.credit import VerlSettings
from deltattg.verl.estimators import StepContext, method_of, step_context

TRAINER_MODE = "deltattg"


def settings_of(algorithm: Any) -> VerlSettings:
    section = algorithm.get("deltattg") if algorithm is not None else None
    return VerlSettings.from_section(OmegaConf.to_container(section, resolve=True) if section is not None else None)


@register_trainer(TRAINER_MODE)
class DeltaTTGTrainer(PPOTrainerSync):
    """``PPOTrainerSync`` whose advantage step hands deltattg's estimators the rows' episodes and steps."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        with open_dict(config):  # verl's base trainer compares the mode with "sync" to pick the sync code paths
            config.trainer.v1.trainer_mode = "sync"
        self.deltattg_method = method_of(config.algorithm.adv_estimator)
        self.deltattg = settings_of(config.algorithm)
        self.deltattg_meter = self.deltattg.load_meter(self.deltattg_method) if self.deltattg_method else None
        super().__init__(config, *args, **kwargs)

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        if self.deltattg_method is None:
            return super()._compute_advantage(batch, metrics)
        rows = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        context = StepContext(
            keys=list(batch.keys),
            padding=[bool(tag.get("is_padding", False)) for tag in batch.tags],
            extra_fields=list(rows["extra_fields"]),
            config=self.deltattg.credit,
            meter=self.deltattg_meter,
        )
        with step_context(context):
            batch = super()._compute_advantage(batch, metrics)
        metrics.update(context.metrics)
        return batch
