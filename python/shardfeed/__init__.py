"""shardfeed: stream training data from S3-compatible object stores to the GPU."""
from . import _shardfeed
from ._shardfeed import (AccessDeniedError, ChangedError, ConfigError, CorruptError, Error,
                         LimitError, NetworkError, NotFoundError, UnsupportedError)

__version__ = _shardfeed.version()
