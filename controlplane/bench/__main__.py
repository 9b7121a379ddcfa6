"""``python -m controlplane.bench``: same as ``galaxy bench``."""

import sys

from controlplane.bench.cli import main

sys.exit(main())
