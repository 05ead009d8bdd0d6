"""Moved to ``reinforge.rewards.models.verifiers`` by the re-layout (issue 26). This old path is the same module, kept for
one release; it goes in the next."""

import sys
import warnings

from reinforge.rewards.models import verifiers as _moved

warnings.warn("reinforge.reward_models.verifiers moved to reinforge.rewards.models.verifiers; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
