"""Conversions: write a checkpoint in another checkpoint format beside the source, which is only
read (unlike ``repair/``, which edits a checkpoint in place). ``universal/``: DeepSpeed ZeRO ->
universal checkpoint; ``torch_dcp/``: DeepSpeed ZeRO -> torch DCP; ``common``: what both do the
same way (the tag they take, the output refusals, temp folder and move into place)."""
