"""The checkpoint knowledge: no textual, no rich; torch and deepspeed only inside functions."""
