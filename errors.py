"""Errors a user can act on. The CLI prints them as one line and exits with status 2 (1 for
:class:`WorkerLost`: the host, not the input; a ``RuntimeError``, not a :class:`KvsimError`)."""


class KvsimError(ValueError):
    """A problem with the user's input or settings, worded for the user.

    A ``ValueError``, so Python callers may catch either.

    ``location`` names where it was found (``file:line`` or ``file:row``) and ``field`` what was
    wrong there; both are optional.
    """

    #: The command line's exit status for it.
    exit_status = 2

    def __init__(self, message: str, *, location: str | None = None, field: str | None = None):
        self.message = message
        self.location = location
        self.field = field
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts = [p for p in (self.location, self.field and f"field '{self.field}'") if p]
        prefix = ": ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message


class TraceError(KvsimError):
    """A trace file that cannot be read as requested."""


class ConfigError(KvsimError):
    """Settings that cannot produce a run (a model that does not fit, an unknown GPU, ...)."""


class WorkerLost(RuntimeError):
    """A worker process ended without its result (killed, out of memory, or a script that
    starts kvsim's workers without a ``__main__`` guard): the host's doing, not the input's,
    so it is no ``ValueError`` (no :class:`KvsimError`), and the command line prints it as
    one line and exits 1, as for a full disk."""

    exit_status = 1


class KvsimWarning(UserWarning):
    """Something a Python caller should know about a finished run (the command line prints
    it as a line instead): requests the deployment rejected."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived (a BaseException, so no ``except Exception`` swallows it);
    the command line turns it into one line and exit status ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def raise_interrupted(signum, frame) -> None:
    """A signal handler: :class:`Interrupted` wherever the program is."""
    raise Interrupted(signum)
