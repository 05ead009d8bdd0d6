"""Evaluation: honest statistics over held-out results.

- :mod:`~reinforge.evaluation.stats`: bootstrap intervals, paired differences.
- :mod:`~reinforge.evaluation.passk`: unbiased pass@k (Chen et al., 2021) and exact maj@k.
- :mod:`~reinforge.evaluation.aggregate`: IQM, stratified bootstrap, probability of improvement,
  performance profiles (Agarwal et al., 2021; rliable).
- :mod:`~reinforge.evaluation.runner`: greedy and sampled evaluation of a model on held-out prompts.
- :mod:`~reinforge.evaluation.boundary`: base-vs-trained pass@k curves (Yue et al., 2025).
- :mod:`~reinforge.evaluation.compare`: multi-seed comparison reports of run directories.
"""

from reinforge.evaluation.aggregate import (
    interval_estimate,
    iqm,
    performance_profile,
    poi_interval,
    probability_of_improvement,
    stratified_bootstrap,
)
from reinforge.evaluation.passk import maj_at_k_curve, pass_at_k, pass_at_k_curve, summarize_samples
from reinforge.evaluation.stats import accuracy_summary, bootstrap_ci, bootstrap_ci_columns, paired_bootstrap_diff

__all__ = [
    "accuracy_summary",
    "bootstrap_ci",
    "bootstrap_ci_columns",
    "paired_bootstrap_diff",
    "pass_at_k",
    "pass_at_k_curve",
    "maj_at_k_curve",
    "summarize_samples",
    "iqm",
    "interval_estimate",
    "stratified_bootstrap",
    "probability_of_improvement",
    "poi_interval",
    "performance_profile",
]
