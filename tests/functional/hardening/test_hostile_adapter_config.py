"""A shared adapter_config.json is someone's file: escape sequences in its values never reach a message raw."""

from __future__ import annotations

import json

import pytest

from ckpt_tui.core.adapters.config import AdapterConfigError, read_lora_config

ESC = "\x1b]0;pwned\x07\x1b[2J[bold red]x[/]"


@pytest.mark.parametrize(
    "doc",
    [
        {"peft_type": ESC, "r": 4},
        {"r": 4, "rank_pattern": {ESC + "(": 2}},
        {"r": 4, "alpha_pattern": {ESC: "8"}},
        {"r": 4, "bias": ESC},
    ],
)
def test_escape_sequences_in_a_refused_value_are_quoted_not_printed(tmp_path, doc):
    p = tmp_path / "adapter_config.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(AdapterConfigError) as e:
        read_lora_config(p)
    assert "\x1b" not in str(e.value) and "\x07" not in str(e.value)
