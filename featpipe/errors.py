"""Errors that featpipe reports to its users.

Every error raised on purpose is a :class:`FeatpipeError` with a one-line message that names
the item (or file, line, parameter) and the cause.  The CLI prints it without a traceback and
exits with status 1.
"""


class FeatpipeError(Exception):
    """A failure the user can act on; ``str(err)`` is one line naming the item and the cause."""

    def __init__(self, message: str, item: str | None = None):
        self.item = item
        self.cause = message
        super().__init__(f"{item}: {message}" if item is not None else message)


class ItemError(FeatpipeError):
    """One item could not be computed; with ``--on-error skip`` the stage goes on without it."""

    def __init__(self, item: str, message: str):
        super().__init__(message, item=item)


class WriteError(FeatpipeError):
    """A file could not be written (disk full, read-only store, no permission).

    Not an item's fault: a stage run stops at the first one, keeps every item already
    recorded, and leaves no temporary or half-written file behind.
    """


class InputError(FeatpipeError, ValueError):
    """A parameter or an input array is invalid (also a ``ValueError`` for library users)."""


class ParameterError(InputError):
    """A parameter value is invalid.  Raised before any stage exists; the CLI exits with 2.

    ``param`` names the parameter as the library spells it (``window``) and the message says
    what is wrong with it as a predicate (``must be >= 1, got 0``): ``str(err)`` is
    ``window must be >= 1, got 0``, and the command line shows the flag instead,
    ``error: --window must be >= 1, got 0``.
    """

    def __init__(self, param: str, message: str):
        self.param = param
        super().__init__(message)
        self.args = (f"{param} {message}",)

    def __str__(self) -> str:
        return f"{self.param} {self.cause}"


def describe_error(err: BaseException) -> str:
    """One line for the ledger and the terminal: featpipe's own message, or type and text."""
    if isinstance(err, FeatpipeError):
        return err.cause
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
