"""The one exception the package raises for a failed job."""


class DblpError(RuntimeError):
    """The DBLP job failed; the message names the cause (and the fix)."""
