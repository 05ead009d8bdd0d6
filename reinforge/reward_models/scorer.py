"""Moved to ``reinforge.rewards.models.scorer`` by the re-layout (issue 26). This old path is the same module, kept for
one release; it goes in the next."""

import sys
import warnings

from reinforge.rewards.models import scorer as _moved

warnings.warn("reinforge.reward_models.scorer moved to reinforge.rewards.models.scorer; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
