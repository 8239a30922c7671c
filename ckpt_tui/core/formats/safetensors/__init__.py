"""safetensors: the header reader (``header``), the file, index and Hugging Face folder formats (``format``) and
the export source (``source``)."""
