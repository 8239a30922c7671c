"""torch.distributed.checkpoint (DCP): the ``.metadata`` reader (``reader``, ``stream``, ``summary``), its formats
(``format``: a DCP folder, its files, the safetensors-backed DCP), the model and optimizer export sources
(``source``, ``optim``)."""
