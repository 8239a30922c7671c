"""torch.save files (zip and legacy): the reader (``torchfile``), the format (``format``), the model and optimizer
export sources (``source``, ``optim``)."""
