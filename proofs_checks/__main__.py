"""``python -m proofs_checks ARGS`` is ``rattn certify ARGS``."""

import sys

from proofs_checks.cli import certify_main

sys.exit(certify_main())
