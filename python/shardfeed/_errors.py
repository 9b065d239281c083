"""shardfeed.Error and its subclasses, one per family of the C library's
sf_status codes (include/shardfeed.h). The C extension raises them with the
status of the failure; code that raises them itself gets the family's
status."""


class Error(Exception):
    """A shardfeed operation failed.

    .status is the sf_status code, .status_name its identifier
    ("SF_ERR_NOT_FOUND"), .message the detail (object, key, byte offset)."""

    status = None
    status_name = None

    def __init__(self, message="", status=None, status_name=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if status_name is not None:
            self.status_name = status_name


class ConfigError(Error, ValueError):
    """A bad option, flag, URL or parameter."""
    status, status_name = 1, "SF_ERR_INVALID_ARGUMENT"


class NotFoundError(Error):
    """A bucket, object, key or file does not exist."""
    status, status_name = 5, "SF_ERR_NOT_FOUND"


class AccessDeniedError(Error):
    """Credentials missing or refused, or a signature mismatch."""
    status, status_name = 6, "SF_ERR_ACCESS_DENIED"


class NetworkError(Error):
    """The store could not be reached or kept failing (connection, timeout,
    HTTP status, throttling, byte range) after the retries."""
    status, status_name = 8, "SF_ERR_NETWORK"


class ChangedError(Error):
    """An object changed (ETag) while it was being read."""
    status, status_name = 11, "SF_ERR_CHANGED"


class LimitError(Error):
    """A configured limit was hit (for a loader: more batches held than its
    ring allows)."""
    status, status_name = 14, "SF_ERR_LIMIT"


class UnsupportedError(Error):
    """A feature this build, server or process lacks."""
    status, status_name = 13, "SF_ERR_UNSUPPORTED"


class CorruptError(Error):
    """Data failed a format or checksum check (shard, sample, image)."""
    status, status_name = 15, "SF_ERR_CORRUPT"


for _cls in (Error, ConfigError, NotFoundError, AccessDeniedError, NetworkError, ChangedError,
             LimitError, UnsupportedError, CorruptError):
    _cls.__module__ = "shardfeed"
del _cls
