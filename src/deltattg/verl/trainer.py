"""verl's synchronous v1 trainer with deltattg's step-level credit: ``trainer.v1.trainer_mode=deltattg``.

Everything is verl's ``PPOTrainerSync`` except the advantage step, which first fetches each row's ``extra_fields``
(written by :mod:`deltattg.verl.agent_loop`) from the TransferQueue for the batch's keys, then runs verl's own
advantage step (rollout correction, write-back) inside a :func:`~deltattg.verl.estimators.step_context`,
so that the registered estimator sees each row's episode and step. Rows are matched by their keys, never by
position: ``_balance_batch`` has already reordered them and added padding rows. The frozen meter is loaded once, in
the trainer's process, from ``algorithm.deltattg`` (:class:`~deltattg.verl.credit.VerlSettings`). The estimators
read each episode's outcome from its record, so ``algorithm.use_kl_in_reward=true`` is refused
(:func:`check_algorithm`), as is a method that needs the failure cost C without one; a meter that fails for
``max_failed_meter_steps`` consecutive steps stops the run (:class:`~deltattg.verl.credit.MeterWatch`).
"""

from __future__ import annotations

from typing import Any

import transfer_queue as tq
from omegaconf import OmegaConf, open_dict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from deltattg.verl.credit import MeterWatch, VerlSettings
from deltattg.verl.estimators import StepContext, method_of, step_context

TRAINER_MODE = "deltattg"


def check_algorithm(algorithm: Any) -> None:
    """Refuse ``algorithm.use_kl_in_reward=true`` with a deltattg estimator: the estimators read each episode's outcome
    from its trajectory record (the environment's reward, what the credit and the meter are defined on), so a KL
    penalty folded into the token-level rewards would silently do nothing. The KL term goes in the actor's loss."""
    if algorithm.get("use_kl_in_reward", False):
        raise ValueError(f"algorithm.use_kl_in_reward=true: algorithm.adv_estimator={algorithm.adv_estimator} reads "
                         "the environment's reward from each episode's record, so a KL penalty in the reward would "
                         "be ignored; set algorithm.use_kl_in_reward=false and put the KL term in the actor's loss "
                         "(actor_rollout_ref.actor.use_kl_loss=true, kl_loss_coef)")  # fmt: skip


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
        if self.deltattg_method is not None:
            check_algorithm(config.algorithm)
        self.deltattg = settings_of(config.algorithm)
        if self.deltattg_method is not None:
            self.deltattg.check_for(self.deltattg_method)
        self.deltattg_watch = MeterWatch(self.deltattg.max_failed_meter_steps)
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
        self.deltattg_watch.record(context.metrics, getattr(self, "global_steps", None))
        return batch
