"""PEFT LoRA adapters: what ``adapter_config.json`` says (:mod:`.config`), where the base model is
(:mod:`.base`), how a training framework's names map to PEFT's (:mod:`.names`). Imports neither peft nor
transformers: the adapter export and the merge read bytes and JSON only."""
