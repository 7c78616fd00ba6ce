"""Ctrl-C while the ``rattn`` command is still loading its modules (about two seconds of imports
before ``cli.main`` runs and handles it) exits as Ctrl-C at any later moment does: status 130
and ``rattn: interrupted`` on a line of its own, no traceback.

``install`` is the first thing the package does when it is imported by the ``rattn`` console
script (``sys.argv[0]`` is the script), and only where Ctrl-C still has Python's own handler (a
job started with SIGINT ignored keeps it ignored); ``cli.main`` gives Ctrl-C back to Python
(``release``) once it can handle the KeyboardInterrupt itself. A program that imports the
package is never affected.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

#: The exit status of an interrupted command: 128 + SIGINT.
INTERRUPTED = 130
MESSAGE = "rattn: interrupted"


def _interrupted(signum: int, frame: Any) -> None:
    os.write(2, f"{MESSAGE}\n".encode())
    os._exit(INTERRUPTED)  # nothing has been written yet: no cleanup to run


def install() -> None:
    """Exit at once on Ctrl-C while the ``rattn`` command loads (module docstring)."""
    command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if command == "rattn" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupted)


def release() -> None:
    """Ctrl-C raises KeyboardInterrupt again (if ``install`` had taken it)."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, signal.default_int_handler)
