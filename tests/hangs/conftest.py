"""The hang tests import the dump maker (make_dumps.py) beside them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
