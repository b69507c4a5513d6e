"""The one exception type for user mistakes: the CLI prints its message in one line and exits 2."""


class UserError(Exception):
    """Bad input from the user (missing file, mismatched store, corrupt shard, ...).

    The message must say what is wrong and where, in one line.
    """
