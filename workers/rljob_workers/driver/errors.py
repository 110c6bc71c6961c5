"""The driver's failures that cross its rooms: a set-up error the user can act on, a signal that came before
the run could handle it, and the one line of an exception that a user is shown."""

from __future__ import annotations

import signal


class SetupError(RuntimeError):
    """Something on this machine keeps the job from starting; the message says what to do."""


class StoppedBeforePoolsUp(BaseException):
    """SIGINT or SIGTERM before a run session handles them itself (Ray's start, the model check).
    A BaseException, as KeyboardInterrupt is: Ray's start must not take it for its own failure."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.signal = signal.Signals(sig)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message ('' if it has none): one line for the user."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
