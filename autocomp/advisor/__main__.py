"""``python -m autocomp.advisor`` (and ``torchrun ... -m autocomp.advisor profile ...``)."""

from __future__ import annotations

import sys

from autocomp.advisor.cli import main

if __name__ == "__main__":
    sys.exit(main())
