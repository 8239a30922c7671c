"""Export: a pure plan of which source bytes become which output tensors, then an executor."""
