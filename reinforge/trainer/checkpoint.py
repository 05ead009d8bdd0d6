"""Moved to ``reinforge.lifecycle.checkpoint`` by the re-layout (issue 26). This old path is the same module, kept for
one release; it goes in the next."""

import sys
import warnings

from reinforge.lifecycle import checkpoint as _moved

warnings.warn("reinforge.trainer.checkpoint moved to reinforge.lifecycle.checkpoint; the old path goes in the next release",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
