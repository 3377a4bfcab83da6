"""Part: devservices. Errors raised by the development services."""

from __future__ import annotations

from gpuprobe.errors import ServiceError


class DevServiceError(ServiceError, RuntimeError):
    """Base class of every error raised by ``gpuprobe.devservices``."""


class BinaryNotFoundError(DevServiceError):
    """The server's executable is not installed (or not where the caller pointed)."""


class StartError(DevServiceError):
    """The server process exited during start, or did not become ready in time.

    ``log_tail`` holds the last lines that this start wrote to the server's log file.
    """

    def __init__(self, message: str, *, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail
