"""The ``verl.plugins`` entry point: verl imports this module at ``import verl`` in every process.

It registers deltattg's estimators (:mod:`deltattg.verl.estimators`), the ``deltattg`` trainer mode
(:mod:`deltattg.verl.trainer`) and the ``deltattg_env`` agent loop (:mod:`deltattg.verl.agent_loop`). verl swallows
a plugin's import errors silently, so a part that cannot load here says so in a warning instead, and so does an
estimator name the registry already holds for another function (which the deltattg trainer then refuses to run).
"""

from __future__ import annotations

import importlib
import warnings

from deltattg.verl.estimators import EstimatorNameTaken, holder, register_estimators, verl_names

try:
    ESTIMATORS = register_estimators()
except EstimatorNameTaken as _taken:  # the free names are registered; the trainer refuses a taken one (method_of)
    warnings.warn(f"deltattg's verl plugin: {_taken}", stacklevel=1)
    ESTIMATORS = sorted(name for name in verl_names() if holder(name) is None)

for _part in ("deltattg.verl.trainer", "deltattg.verl.agent_loop"):
    try:
        importlib.import_module(_part)
    except ImportError as _error:  # verl's trainer and agent loops need its full dependency set (hydra, transfer_queue…)
        warnings.warn(f"deltattg's verl plugin could not load {_part}: {_error}", stacklevel=1)
