"""DeepSpeed: ZeRO tag folders, their model/optimizer states files and universal checkpoints. ``reader`` reads the
states files' headers, ``format`` states what ``format.py`` asks, ``source`` and the per-layout modules turn a tag into
byte ranges, ``optim`` exports its optimizer state."""
