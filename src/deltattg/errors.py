"""The one error type for bad user input: it names the file, the line and the field."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input, located as precisely as we can: ``path:line: field: message``."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None, field: str | None = None):
        self.message = message
        self.path = path
        self.line = line
        self.field = field
        super().__init__(str(self))

    def located(self, *, path: str | None = None, line: int | None = None) -> "InputError":
        """The same error with a file and line filled in where they were unknown."""
        return InputError(self.message, path=self.path or path, line=self.line or line, field=self.field)

    def __str__(self) -> str:
        where = ":".join(str(p) for p in (self.path, self.line) if p is not None)
        what = f"{self.field}: {self.message}" if self.field else self.message
        return f"{where}: {what}" if where else what


class ServiceDown(RuntimeError):
    """A service the run depends on (a retrieval server, a meter endpoint) failed too many times in a row: the run
    stops rather than go on as if it answered (the command exits with ``EXIT_SERVICE_DOWN``; what was finished is
    kept)."""
