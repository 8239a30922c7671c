"""What diagnose reports about a leftover of a killed ckpt-tui run: what it is and the command that removes it."""

from __future__ import annotations

from typing import cast

from ...facts import (
    LeftoverFacts,
)
from ...types import Finding, Inventory, Node, shell_path

LEFTOVER_WHAT = {
    "temp-folder": "temp folder",
    "staging-folder": "staging folder",
    "old-output": "old output folder",
    "lock": "lock file",
    "temp-file": "temp file",
}


def leftover_finding(inv: Inventory, n: Node) -> Finding:
    """``leftover-temp``: what a killed ckpt-tui run left (facts from leftovers.recognise); how to be rid of it."""
    from ...units import naturalsize

    f = cast(LeftoverFacts, n.facts)
    p = n.path
    where = f"`{inv.shown(p)}`"
    what = LEFTOVER_WHAT.get(f.get("leftover_kind", ""), "temp entry")
    command = f.get("leftover_of", "ckpt-tui")
    files = f.get("leftover_files", 0)
    size = naturalsize(n.size) + (f", {files:,} file{'s' if files != 1 else ''}" if n.is_dir else "")
    parent = p.rsplit("/", 1)[0] if "/" in p else "."
    if f.get("leftover_held"):
        return Finding(
            "leftover-temp",
            "info",
            p,
            f"{where} is the {what} of a {command} still running ({size}; it "
            "holds its lock): leave it, it goes when that run ends.",
        )
    if command == "ckpt-tui export":
        out = f.get("leftover_out", "")
        nxt = f"the next ckpt-tui export into {shell_path(inv.given, f'{parent}/{out}' if parent != '.' else out)}"
    elif command == "ckpt-tui fix":
        nxt = f"the next ckpt-tui fix that rewrites {f.get('leftover_out', '')} beside it"
    else:
        nxt = f"the next {command} writing its output in {shell_path(inv.given, parent)}"
    if f.get("leftover_restores"):
        back = shell_path(inv.given, f"{parent}/{f['leftover_restores']}" if parent != "." else f["leftover_restores"])
        return Finding(
            "leftover-temp",
            "warning",
            p,
            f"{where} is the previous output an --overwrite was replacing "
            f"when it was killed ({size}), and {back} is gone: {nxt} renames it back, or do it now: "
            f"`mv -- {shell_path(inv.given, p)} {back}`.",
        )
    rm = f"rm -rf -- {shell_path(inv.given, p)}" if n.is_dir else f"rm -- {shell_path(inv.given, p)}"
    return Finding(
        "leftover-temp",
        "warning",
        p,
        f"{where} is a {what} a killed {command} left ({size}); "
        f"{'its partial files were' if n.is_dir else 'it was'} not read. {nxt[0].upper()}{nxt[1:]} sweeps it, or remove it now: `{rm}`.",
    )
