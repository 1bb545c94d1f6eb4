"""One exception type for every user-facing failure.

Messages are a single line saying what went wrong and what to do, so the CLI can
print them without a traceback.
"""


class RagsieveError(Exception):
    """A user-facing error: bad input, a missing model or data file, a wrong config key."""


class DataError(RagsieveError):
    """Malformed or missing data (names file:line where it can)."""


class ModelNotAvailable(RagsieveError):
    """A model spec that cannot be resolved here (missing package, file or unknown name)."""
