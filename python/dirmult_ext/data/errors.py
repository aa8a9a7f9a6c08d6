"""The data layer's error: a file that cannot be read as counts."""

__all__ = ["CountFileError"]


class CountFileError(ValueError):
    """A file that cannot be read as counts, labels or covariates (corrupt,
    truncated, of another format, a directory): the message names the file
    and what is wrong with it."""
