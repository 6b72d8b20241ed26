"""The one error a subscription filter reports: it does not parse, or breaks a limit."""

from __future__ import annotations

from tidemq.core.errors import InvalidRequest

__all__ = ["FilterSyntaxError"]


class FilterSyntaxError(InvalidRequest):
    """A tag expression or SQL92 filter that is refused when subscribing.

    The message names the language, the problem and the 1-based column (a newline counts
    as one character), e.g. ``SQL92 filter: expected a value after '=' at column 12, found
    end of input``. On the wire it travels as INVALID_REQUEST with that message.
    """

    def __init__(self, language: str, problem: str, column: int, found: str | None = None):
        message = f"{language} filter: {problem} at column {column}"
        if found is not None:
            message += f", found {found}"
        super().__init__(message)
        self.problem = problem
        self.column = column
