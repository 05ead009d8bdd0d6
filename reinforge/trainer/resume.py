"""Moved to ``reinforge.lifecycle.resume`` by the re-layout (issue 26). This old path is the same module, kept for
one release; it goes in the next."""

import sys
import warnings

from reinforge.lifecycle import resume as _moved

warnings.warn("reinforge.trainer.resume moved to reinforge.lifecycle.resume; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
