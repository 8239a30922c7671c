"""Every finding code once: its severities, a one-line help, the fix id it offers and the TUI key
that runs that fix. ``diagnose`` raises only these codes; the CLI, the TUI's help screen and
details pane and the README's "Finding codes" table all read this registry (a unit test holds the
README to it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Fix:
    id: str  # what a finding's ``fix`` names
    key: str  # the TUI key that starts it
    command: bool  # `ckpt-tui fix --only ID` runs it (False: advice elsewhere, e.g. `export`)


FIXES: dict[str, Fix] = {
    f.id: f
    for f in (
        Fix("universal-info", "x / u", True),
        Fix("latest", "x", True),
        Fix("dcp-metadata", "x", True),
        Fix("export", "e", True),
        Fix("index", "x", False),
    )
}


@dataclass(frozen=True)
class FindingCode:
    code: str
    severities: tuple[str, ...]  # as documented, worst first
    help: str  # one line
    fix: Optional[str] = None  # the fix id its findings offer (when one applies)

    @property
    def key(self) -> Optional[str]:
        """The TUI key that fixes it."""
        return FIXES[self.fix].key if self.fix else None


# world-size-mismatch is also raised as info (a pipeline-parallel or MoE tag) and unsafe-pickle as
# info under --trust-pickles: milder than documented, on purpose (tests/unit/test_findings.py).
CODES: dict[str, FindingCode] = {
    c.code: c
    for c in (
        FindingCode(
            "dcp-metadata-missing",
            ("error",),
            ".distcp shards without .metadata: the save was interrupted",
            "dcp-metadata",
        ),
        FindingCode(
            "dcp-components",
            ("info",),
            "a folder holding DCP folders (model vs optimizer) rather than being one",
            "export",
        ),
        FindingCode(
            "universal-info-missing",
            ("warning", "info"),
            "ZeRO-1/2 states lack universal_checkpoint_info: ds_to_universal refuses them",
            "universal-info",
        ),
        FindingCode(
            "shard-missing", ("error",), "a rank file named in .metadata or implied by the world size is absent"
        ),
        FindingCode(
            "dcp-chunk-gap", ("error",), "a DCP tensor whose chunks leave part of it unwritten (export refuses it)"
        ),
        FindingCode(
            "dcp-chunk-overlap", ("warning",), "a DCP tensor whose chunks overlap (exported as torch reads them)"
        ),
        FindingCode("world-size-mismatch", ("error", "warning"), "rank files from another world size are mixed in"),
        FindingCode(
            "megatron-files-missing", ("error",), "Megatron-Core torch_dist without metadata.json or common.pt"
        ),
        FindingCode("latest-dangling", ("error",), "`latest` names a tag that is not there", "latest"),
        FindingCode("latest-missing", ("warning",), "DeepSpeed tags without a `latest` file", "latest"),
        FindingCode("file-truncated", ("error",), "a file shorter than its header says"),
        FindingCode("file-corrupt", ("error",), "a file whose header or archive is broken"),
        FindingCode("unsafe-pickle", ("error",), "a pickle naming code outside the allowlist (never run)"),
        FindingCode("index-mismatch", ("error",), "a safetensors index that disagrees with its shards", "index"),
        FindingCode("mixed-dtypes", ("info",), "floating tensors of several dtypes"),
        FindingCode("frozen-params", ("info",), "parameters without optimizer state", "export"),
        FindingCode("tied-weights", ("info",), "tensors sharing storage (written once on export)", "export"),
        FindingCode("adapter-only", ("info",), "a PEFT adapter without the base model"),
        FindingCode("not-a-checkpoint", ("error",), "nothing recognised"),
        FindingCode("unreadable", ("error", "warning"), "permission denied, symlink loop, too deep"),
        FindingCode("special-file", ("warning",), "a FIFO or device in the tree (never opened)"),
        FindingCode(
            "leftover-temp",
            ("warning", "info"),
            "temp files a killed ckpt-tui run left (never read; its next run sweeps them)",
        ),
    )
}


def fix_key(fix: str) -> str:
    """The TUI key that runs fix ``fix`` (``x``, the generic fix key, for one not registered)."""
    f = FIXES.get(fix)
    return f.key if f else "x"
