"""Moved to ``reinforge.config.curriculum`` by the re-layout (issue 26). This old path is the same module, kept for
one release; it goes in the next."""

import sys
import warnings

from reinforge.config import curriculum as _moved

warnings.warn("reinforge.curriculum.config moved to reinforge.config.curriculum; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
