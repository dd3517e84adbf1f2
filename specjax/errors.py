"""The error a user can fix, shared by every layer and reported by the entry points
(`cli.entrypoint`) as one line without a traceback."""


class SpecjaxError(RuntimeError):
    """A problem the user can fix (bad checkpoint, diverged run...), reported without traceback."""
