"""Evaluation: honest statistics over held-out results (bootstrap intervals, paired comparisons)."""

from reinforge.evaluation.stats import accuracy_summary, bootstrap_ci, paired_bootstrap_diff

__all__ = ["accuracy_summary", "bootstrap_ci", "paired_bootstrap_diff"]
