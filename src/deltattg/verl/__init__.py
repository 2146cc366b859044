"""deltattg as a verl plugin (``pip install 'deltattg[verl]'``; see docs/verl.md).

* :mod:`~deltattg.verl.credit` — step-level credit on verl's step rows (no verl import);
* :mod:`~deltattg.verl.estimators` — the estimators in verl's advantage registry;
* :mod:`~deltattg.verl.trainer` — ``trainer.v1.trainer_mode=deltattg``;
* :mod:`~deltattg.verl.agent_loop` — the ``deltattg_env`` agent loop over deltattg's environments;
* :mod:`~deltattg.verl.plugin` — the ``verl.plugins`` entry point that registers them.
"""
