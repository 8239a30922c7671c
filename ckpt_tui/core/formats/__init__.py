"""On-disk formats. Readers (pickles, torchfile, dcp, deepspeed, safetensors_header) read headers and
metadata only, never tensor data; one module per format (dcp_folder, deepspeed_folder,
safetensors_file, torch_save, plain_files) states what ``format.py`` asks, and ``registry.py``
lists them in detection order. This package's own module holds only FormatError, so every reader
can import it without importing the registry."""


class FormatError(Exception):
    """A file that cannot be read as what it claims to be. ``kind`` is 'truncated' or 'corrupt'."""

    def __init__(self, message: str, kind: str = "corrupt"):
        super().__init__(message)
        self.kind = kind
