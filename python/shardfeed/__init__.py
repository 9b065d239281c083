"""shardfeed: stream training data from S3-compatible object stores to the GPU.

``shardfeed.Loader`` streams decoded batches; ``shardfeed.torch`` adapts it
to PyTorch's DataLoader conventions. Batches share the loader's memory with
torch and NumPy through DLPack. See docs/python.md.
"""
import logging as _logging

from . import _shardfeed
from ._shardfeed import (AccessDeniedError, Array, Batch, ChangedError, ConfigError, CorruptError,
                         Error, LimitError, NetworkError, NotFoundError, UnsupportedError)
from ._loader import Loader
from ._tools import ls, stat, warm_cache, pack, index
from ._doctor import doctor, tune

__version__ = _shardfeed.version()
cuda_compiled = _shardfeed.cuda_compiled()

# The library's log lines go to this logger (shardfeed threads queue them;
# the thread calling into shardfeed hands them over).
_logging.getLogger("shardfeed").addHandler(_logging.NullHandler())

__all__ = [
    "Loader", "doctor", "tune", "ls", "stat", "warm_cache", "pack", "index",
    "Batch", "Array", "Error", "ConfigError", "NotFoundError", "AccessDeniedError",
    "NetworkError", "ChangedError", "CorruptError", "LimitError", "UnsupportedError",
    "__version__", "cuda_compiled",
]
