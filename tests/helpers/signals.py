"""Signals as a user's terminal delivers them, for tests that press Ctrl-C on a command they started."""

from __future__ import annotations

import signal


def ctrl_c_as_in_a_terminal() -> None:
    """SIGINT's default action in the started process (a `preexec_fn`), as in a user's terminal: a test run
    started in the background by a non-interactive shell inherits SIGINT ignored, and Python then never turns it
    into KeyboardInterrupt (CI runs started so failed with a study, and a sync, finishing as if never stopped)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
