"""The error every bad input ends in: one line naming what to fix, never a traceback from deep inside."""

from __future__ import annotations


class OneLineError(ValueError):
    """A message that stays one line whatever it quotes (a path or value with a newline in it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message.replace("\n", "\\n"))


class OptionError(ValueError):
    """A bad option value; the message names the option and the fix."""
