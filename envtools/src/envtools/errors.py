"""One exception type for problems the user can fix, so the CLI can print them cleanly."""

from __future__ import annotations


class EnvtoolsError(Exception):
    """A problem with the user's input or environment, with the fix in ``hint``.

    The CLI prints ``error: <message>`` and ``hint: <hint>`` and exits with ``exit_code``
    instead of a traceback, because these are expected, actionable failures.
    """

    def __init__(self, message: str, hint: str = "", exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
