"""The household regime: the CPU experiment that ``deltattg demo`` runs once and ``bench/bench_train.py`` runs per
seed — its settings, its stages and the statistics that compare its RL arms.

Modules: ``config`` (every setting, in one dataclass, with the demo's budget and ``--quick`` variant), ``stages`` (base
actor, trajectory pool, regression meter, RL arms: each a function over plain data), ``comparison`` (paired-seed
statistics: t intervals, exact permutation p-values, steps-to-reach ratios, collapses).
"""
