"""Moved to ``reinforge.rewards.models.guard`` by the re-layout (issue 26). This old path is the same module, kept for
one release; it goes in the next."""

import sys
import warnings

from reinforge.rewards.models import guard as _moved

warnings.warn("reinforge.reward_models.guard moved to reinforge.rewards.models.guard; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
