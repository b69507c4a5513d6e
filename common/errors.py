"""The one exception type for user mistakes: the CLI prints its message in one line and exits 2."""


class UserError(Exception):
    """Bad input from the user (missing file, mismatched store, corrupt shard, ...).

    The message must say what is wrong and where, in one line.
    """


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first non-empty line (its type name if it has none), for a one-line error."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
