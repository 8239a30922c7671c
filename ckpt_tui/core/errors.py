"""Exit codes shared by every command."""

EXIT_OK = 0
EXIT_FINDINGS = 1  # findings of severity error, or the operation failed
EXIT_USAGE = 2  # unreadable path or bad usage
EXIT_INTERRUPTED = 130
