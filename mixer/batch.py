"""Deprecated alias of `mixer.pipeline.batch` (moved in 0.2; removed in 0.3)."""

import sys

from mixer.pipeline import batch as _module

sys.modules[__name__] = _module
