"""Deprecated alias of `mixer.runtime.state` (moved in 0.2; removed in 0.3)."""

import sys

from mixer.runtime import state as _module

sys.modules[__name__] = _module
