"""Wrong mappings a `--to hf` logits test must see (issue 27): copies of an exported Hugging Face folder with two
tensors swapped, as a mapping that took gate for up or one norm for the other would write them. Each test measures
its framework's logits on them; the gap must be >= 100x the tolerance."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

# what -> the two tensors of the exported folder it swaps
SWAPS = {
    "gate/up swapped": ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"),
    "norms swapped": ("model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"),
}


def swapped_copies(out: Path, under: Path) -> dict[str, Path]:
    """what -> a copy of the export ``out`` under ``under`` with SWAPS[what]'s two tensors exchanged."""
    made = {}
    for what, (a, b) in SWAPS.items():
        d = under / what.replace(" ", "-").replace("/", "-")
        shutil.copytree(out, d)
        sd = load_file(d / "model.safetensors")
        sd[a], sd[b] = sd[b].clone(), sd[a].clone()
        save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
        made[what] = d
    return made
