"""Moved to reinforge.rewards.models.verifiers (docs/architecture.md names this path); this alias goes after one release."""
from reinforge.rewards.models.verifiers import *  # noqa: F401,F403
