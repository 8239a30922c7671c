"""Conversions: write a checkpoint in another checkpoint format beside the source, which is only
read (unlike ``repair/``, which edits a checkpoint in place). ``universal/``: DeepSpeed ZeRO ->
universal checkpoint."""
