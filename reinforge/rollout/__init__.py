"""Generating completions with token ids and log-probs."""

from .hf import HFGenerator, SamplingParams, left_pad

__all__ = ["HFGenerator", "SamplingParams", "left_pad"]
