"""Deprecated alias of `mixer.runtime.dist` (moved in 0.2; removed in 0.3)."""

import sys

from mixer.runtime import dist as _module

sys.modules[__name__] = _module
