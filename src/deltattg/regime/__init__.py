"""The household regime: the CPU experiment that ``deltattg demo`` runs once and ``bench/bench_train.py`` runs per
seed — its settings, its stages, the seed orchestrator both call, and the statistics that compare its RL arms.

Modules: ``config`` (every setting, in one dataclass — the trainer's credit, loss and optimiser sections nested in
it — with the demo's budget and ``--quick`` variant), ``stages`` (base actor, trajectory pool, labels, meters, the
shared trainer settings, RL arm specs: each a function over plain data), ``seeds`` (one seed prepared once, stamped,
reused or refused, and run arm by arm), ``comparison`` (paired-seed statistics: t intervals, exact permutation
p-values, steps-to-reach ratios, collapses).
"""
