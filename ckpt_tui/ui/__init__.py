"""The Textual face of ckpt-tui. Imported only when the TUI runs (`ckpt-tui PATH`)."""
