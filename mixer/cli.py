"""Deprecated alias of `mixer.tools.cli` (moved in 0.2; removed in 0.3)."""

import sys

from mixer.tools import cli as _module

if __name__ == "__main__":   # python -m mixer.cli
    sys.exit(_module.main())
sys.modules[__name__] = _module
