"""One reader per on-disk format. Each reads headers and metadata only, never tensor data."""

class FormatError(Exception):
    """A file that cannot be read as what it claims to be. ``kind`` is 'truncated' or 'corrupt'."""

    def __init__(self, message: str, kind: str = "corrupt"):
        super().__init__(message)
        self.kind = kind
