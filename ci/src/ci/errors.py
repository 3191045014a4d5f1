"""The one error type ci reports to its user.

Every stage raises :class:`CiError` (or a subclass: a recipe that does not render, a
dependency cycle, a source whose sha256 differs, ...) with what went wrong and what to do
about it; the command line catches it in one place, prints both and exits with ``code``
(2: the input is wrong and nothing was built; 1: a build, test or stand-in failed). No
stage prints an error and exits by itself, so each can be called and tested alone.
"""

from __future__ import annotations


class CiError(Exception):
    """A failure with the problem (``msg``) and the fix (``hint``), ending the run."""

    code: int = 2

    def __init__(self, msg: str, hint: str = "", *, code: int | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.hint = hint
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.msg} {self.hint}".strip() if self.hint else self.msg
