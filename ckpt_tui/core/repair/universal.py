"""Convert a DeepSpeed ZeRO checkpoint to a universal checkpoint with DeepSpeed's own converter.

We never reimplement ``ds_to_universal``: we screen the checkpoint (the converter unpickles
freely), run it as a subprocess in its own process group with a watchdog, give it an output folder
nested in a private temp folder (it writes ``latest_universal`` into its output's parent), verify
what it wrote against the fp32 masters we reconstruct ourselves, move the result into place with
``os.replace`` and only then write our own ``latest_universal``.

Process safety: the child is a tiny watchdog (``_WATCHDOG``) started with ``start_new_session``;
it sets its own parent-death signal (``prctl(PR_SET_PDEATHSIG)``, done in the child rather than in a
``preexec_fn`` so callers with threads — the TUI — stay safe), checks its parent is still the one
that started it, and starts the converter with ``PR_SET_PDEATHSIG(SIGKILL)`` in ``preexec_fn``. It
polls its parent pid; when ckpt-tui dies (even by ``kill -9``) it is reparented, or its death
signal fires, and it SIGKILLs its whole process group — the converter and its pool workers
(grandchildren). Cancel and any exception in ckpt-tui also kill the group and remove the temp.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..export.write import ExportError
from ..model import Plan, PlanStep
from ..progress import Cancelled, OnProgress, report

CONVERTER_MODULE = "deepspeed.checkpoint.ds_to_universal"
FROZEN_FILE = "frozen_params.safetensors"
TMP_PREFIX = ".ckpt-tui-universal-"
STATE_FILES_Z12 = ("fp32", "exp_avg", "exp_avg_sq", "step")
STATE_FILES_Z3 = ("fp32", "exp_avg", "exp_avg_sq")


class UniversalError(ExportError):
    """The conversion cannot run or failed; the message says why and what to do."""


# ---------------------------------------------------------------------------------------------
# plan


@dataclass
class UniversalPlan:
    src: Path
    tag_dir: Path
    out: Path
    stage: int
    world_size: int
    global_step: Optional[int]
    framework: Optional[str]
    layout: str
    inject_missing_state: bool
    trainable: list[str]
    frozen: list[str]
    buffers: list[str]
    expected_files: int
    estimated_bytes: int
    trust_pickles: bool = False
    target_stage: Optional[int] = None
    export_frozen: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def frozen_file(self) -> Path:
        return self.out.parent / FROZEN_FILE

    def command(self, output_folder: Path) -> list[str]:
        cmd = [sys.executable, "-m", CONVERTER_MODULE, "--input_folder", str(self.tag_dir),
               "--output_folder", str(output_folder), "--num_extract_workers", str(_workers()),
               "--num_merge_workers", "1"]
        if self.inject_missing_state:
            cmd.append("--inject_missing_state")
        return cmd

    def to_plan(self) -> Plan:
        steps = [
            PlanStep("mkdir", str(self.out.parent / f"{TMP_PREFIX}XXXX"), detail="private temp folder beside the output"),
            PlanStep("run", " ".join(self.command(self.out.parent / f"{TMP_PREFIX}XXXX" / "inner" / self.out.name)),
                     source=str(self.tag_dir), bytes=self.estimated_bytes,
                     detail=f"DeepSpeed's converter, {self.expected_files} state files expected; log in the temp folder"),
            PlanStep("run", "verify", detail="every parameter's state files present; fp32 bit-exact vs the source masters"),
            PlanStep("replace", str(self.out), detail="os.replace of the verified folder"),
            PlanStep("write", str(self.out.parent / "latest_universal"), detail=f"contains {self.out.name!r}"),
        ]
        if self.export_frozen and (self.frozen or self.buffers):
            steps.append(PlanStep("write", str(self.frozen_file),
                                  detail=f"{len(self.frozen)} frozen param(s) + {len(self.buffers)} buffer(s)"))
        notes = [f"source {self.tag_dir} (ZeRO-{self.stage}, {self.world_size} ranks) is only read, never modified"]
        if self.inject_missing_state:
            notes.append("universal_checkpoint_info is missing: --inject_missing_state supplies it in memory")
        notes += self.warnings
        return Plan(f"Convert {self.tag_dir} to a DeepSpeed universal checkpoint in {self.out}", tuple(steps),
                    tuple(notes))

    def to_json(self) -> dict:
        return {"src": str(self.src), "tag_dir": str(self.tag_dir), "out": str(self.out), "zero_stage": self.stage,
                "world_size": self.world_size, "global_step": self.global_step, "framework": self.framework,
                "inject_missing_state": self.inject_missing_state, "trainable": len(self.trainable),
                "frozen": list(self.frozen), "buffers": list(self.buffers), "expected_files": self.expected_files,
                "warnings": list(self.warnings), "plan": self.to_plan().to_json()}


def _workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def _in_subtree(path: str, root: str) -> bool:
    return root == "." or path == root or path.startswith(root.rstrip("/") + "/")


def universal_plan(src, out=None, *, trust_pickles: bool = False, target_stage: Optional[int] = None,
                   export_frozen: bool = False) -> UniversalPlan:
    """Resolve SRC to a ZeRO tag folder and say what converting it will do. Writes nothing.

    Raises ``ScanError`` for an unreadable path, :class:`UniversalError` where it cannot convert.
    """
    from ..export.deepspeed_source import MOE_RE, deepspeed_source
    from ..formats import torchfile
    from ..formats.deepspeed import LAYER_RE
    from ..inspect import inspect

    src = Path(src)
    rep = inspect(src, trust_pickles=trust_pickles)
    inv = rep.inventory
    comp = inv.components.get("model") or inv.components.get("model+optimizer")
    node = inv.node(comp) if comp else None
    if node is None or node.format != "deepspeed-zero":
        if node is not None and node.format == "deepspeed-universal" or inv.layout == "universal":
            raise UniversalError(f"{src} is already a DeepSpeed universal checkpoint: load it with "
                                 '{"checkpoint": {"load_universal": true}}')
        raise UniversalError(f"{src} is not a DeepSpeed ZeRO checkpoint ({inv.summary}); universal conversion "
                             "needs a DeepSpeed tag folder (global_stepN/) with *_optim_states.pt files")
    f = node.facts
    tag_dir = node.abspath
    names = [c.name for c in node.children]
    if f.get("pipeline") or any(LAYER_RE.match(n) for n in names):
        raise UniversalError("pipeline-parallel checkpoints (layer_*-model_states.pt) are not supported here: "
                             "ds_to_universal handles them only for Megatron-DeepSpeed layouts")
    if f.get("moe") or any(MOE_RE.search(n) for n in names):
        raise UniversalError("MoE checkpoints (expert_*/expp_rank_* files) are not supported: convert them with "
                             "the tooling of the framework that wrote them")
    if (f.get("mp_world_size") or 1) > 1:
        raise UniversalError(f"model-parallel checkpoints (mp_world_size={f['mp_world_size']}) are not supported here")
    errs = [x for x in rep.findings if x.severity == "error" and _in_subtree(x.path, node.path)
            and x.code != "unsafe-pickle"]
    if errs:
        lines = "; ".join(f"{x.code} {x.path}: {x.message}" for x in errs[:4])
        raise UniversalError(f"{tag_dir} has errors, DeepSpeed cannot convert it: {lines}")
    unsafe = [x for x in rep.findings if x.code == "unsafe-pickle" and _in_subtree(x.path, node.path)]
    if unsafe and not trust_pickles:
        raise UniversalError(f"{unsafe[0].path} names code outside ckpt-tui's allowlist; DeepSpeed's converter "
                             "unpickles without restriction and would run it. Convert only a checkpoint you trust, "
                             "with --trust-pickles")
    stage = f.get("zero_stage")
    if stage not in (1, 2, 3):
        raise UniversalError(f"unsupported ZeRO stage {stage!r} in {tag_dir} (universal conversion needs ZeRO-1/2/3)")
    try:
        source = deepspeed_source(tag_dir)
    except ValueError as e:
        raise UniversalError(f"{tag_dir}: {e}") from None
    buffer_names: set[str] = set()
    ms = tag_dir / "mp_rank_00_model_states.pt"
    if not ms.is_file():
        ms = tag_dir / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    try:
        obj = torchfile.read(ms).obj
        if isinstance(obj, dict):
            buffer_names = {str(b) for b in (obj.get("buffer_names") or [])}
    except Exception:  # noqa: BLE001 - already screened by the inspector; buffers are only informative
        pass
    trainable, frozen, buffers = [], [], []
    for t in source.tensors:
        if t.tied_to:
            continue
        if t.name in buffer_names:
            buffers.append(t.name)
        elif t.frozen:
            frozen.append(t.name)
        else:
            trainable.append(t.name)
    if stage <= 2:
        expected = 4 * len(trainable) + len(frozen) + len(buffers)
    else:
        expected = 3 * len(trainable)
    params = sum(t.numel for t in source.tensors if not t.tied_to)
    estimated = 3 * 4 * params + sum(c.size for c in node.children if "model_states" in c.name)

    if out is None:
        out = tag_dir.parent / f"{tag_dir.name}_universal"
    out = Path(os.path.abspath(out))
    if out == tag_dir or tag_dir in out.parents:
        raise UniversalError(f"the output {out} is inside the source {tag_dir}; the source is never modified: "
                             "choose --out elsewhere")
    if out.exists():
        if not out.is_dir() or any(out.iterdir()):
            raise UniversalError(f"{out} already exists and is not empty; remove it or choose --out")
    parent = out.parent
    if not parent.is_dir():
        raise UniversalError(f"{parent} does not exist; create it first or choose --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UniversalError(f"cannot write to {parent} (permission denied or read-only); choose --out "
                             "on a writable filesystem")
    try:
        free = shutil.disk_usage(parent).free
    except OSError:
        free = None
    if free is not None and free < 2 * estimated:
        raise UniversalError(f"{parent} has {free:,} bytes free; the conversion needs about {2 * estimated:,} "
                             "(the converter writes its slices and the result side by side)")
    warnings: list[str] = []
    if export_frozen and (frozen or buffers) and (parent / FROZEN_FILE).exists():
        raise UniversalError(f"{parent / FROZEN_FILE} already exists; move it away or choose --out")
    if frozen or buffers:
        what = []
        if frozen:
            what.append(f"{len(frozen)} frozen parameter(s) ({', '.join(frozen[:3])}{', ...' if len(frozen) > 3 else ''})")
        if buffers:
            what.append(f"{len(buffers)} buffer(s) ({', '.join(buffers[:3])}{', ...' if len(buffers) > 3 else ''})")
        warnings.append(
            " and ".join(what) + ": load_universal restores only optimizer-tracked parameters, so these keep "
            "whatever the model was built with on resume"
            + (" (ZeRO-3: the converter leaves frozen parameters out entirely)" if stage == 3 and frozen else "")
            + ". Remedy: --export-frozen writes them to " + FROZEN_FILE + " next to the output; load it into the "
            "model as the instructions show.")
    if target_stage is not None and target_stage != stage:
        if (target_stage == 3) != (stage == 3):
            warnings.append(f"target ZeRO-{target_stage} differs from the source's ZeRO-{stage}: DeepSpeed fails to "
                            "load a universal checkpoint across ZeRO-1/2 <-> ZeRO-3 (a bare AssertionError). "
                            f"Resume with ZeRO-{stage}" + (" (or ZeRO-1/2)" if stage in (1, 2) else "") + ".")
        else:
            warnings.append(f"target ZeRO-{target_stage} differs from the source's ZeRO-{stage}; ZeRO-1 <-> 2 loads "
                            "(measured with deepspeed 0.19.8 on CPU).")
    return UniversalPlan(src=src, tag_dir=tag_dir, out=out, stage=stage, world_size=int(f.get("world_size") or 0),
                         global_step=f.get("global_step"), framework=inv.framework, layout=inv.layout,
                         inject_missing_state=(stage <= 2 and not f.get("universal_checkpoint_info")),
                         trainable=trainable, frozen=frozen, buffers=buffers, expected_files=expected,
                         estimated_bytes=estimated, trust_pickles=trust_pickles, target_stage=target_stage,
                         export_frozen=export_frozen, warnings=warnings)


# ---------------------------------------------------------------------------------------------
# verification


@dataclass
class UniversalVerification:
    ok: bool
    checked: int
    problems: list[str] = field(default_factory=list)
    frozen_ok: list[str] = field(default_factory=list)
    frozen_absent: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"ok": self.ok, "checked": self.checked, "problems": self.problems, "frozen_ok": self.frozen_ok,
                "frozen_absent": self.frozen_absent, "notes": self.notes}


def _load_state(path: Path):
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict) and "param" in obj:
        obj = obj["param"]
    return obj


def _bits_equal(a, b) -> bool:
    import torch

    if a.dtype != b.dtype or a.numel() != b.numel():
        return False
    a, b = a.reshape(-1).contiguous(), b.reshape(-1).contiguous()
    if a.dtype.is_floating_point:
        iv = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(iv), b.view(iv))
    return torch.equal(a, b)


def verify_universal(universal_dir, tag_dir, *, cancel=None) -> UniversalVerification:
    """Check a universal checkpoint against the ZeRO tag folder it was converted from.

    Trainable parameters: ``fp32``/``exp_avg``/``exp_avg_sq`` (+ ``step`` for ZeRO-1/2) present and
    fp32 bit-exact equal to the master reconstructed from the source. Frozen parameters and buffers
    (ZeRO-1/2): ``fp32`` equal to the upcast model weight; absent (ZeRO-3): reported.
    """
    from ..export.deepspeed_source import deepspeed_source
    from ..export.sources import to_torch
    from ..progress import check_cancel

    universal_dir, tag_dir = Path(universal_dir), Path(tag_dir)
    try:
        source = deepspeed_source(tag_dir)
    except ValueError as e:
        raise UniversalError(f"{tag_dir}: {e}") from None
    from ..formats import torchfile

    stage = 3 if any(p.name.startswith("zero_pp_rank_") and p.name.endswith("_model_states.pt")
                     for p in tag_dir.iterdir()) else 2
    buffer_names: set[str] = set()
    ms = tag_dir / ("mp_rank_00_model_states.pt" if stage <= 2 else "zero_pp_rank_0_mp_rank_00_model_states.pt")
    obj = torchfile.read(ms).obj
    if isinstance(obj, dict):
        buffer_names = {str(b) for b in (obj.get("buffer_names") or [])}
    zdir = universal_dir / "zero"
    res = UniversalVerification(ok=False, checked=0)
    if not zdir.is_dir():
        res.problems.append(f"{universal_dir} has no zero/ folder")
        return res
    for name in ("optimizer_state.pt",):
        if not (zdir / name).is_file():
            res.problems.append(f"zero/{name} missing")
    states = STATE_FILES_Z12 if stage <= 2 else STATE_FILES_Z3
    for t in source.tensors:
        check_cancel(cancel)
        if t.tied_to:
            continue
        pdir = zdir / t.name
        is_buf = t.name in buffer_names
        if t.frozen or is_buf:
            fp = pdir / "fp32.pt"
            if not fp.is_file():
                if stage == 3 and is_buf:
                    res.notes.append(f"buffer {t.name} is not in the universal checkpoint (ZeRO-3); "
                                     "load_universal does not restore buffers")
                elif stage == 3:
                    res.frozen_absent.append(t.name)
                else:
                    res.problems.append(f"{'buffer' if is_buf else 'frozen param'} {t.name}: zero/{t.name}/fp32.pt missing")
                continue
            got = _load_state(fp)
            if not _bits_equal(got, to_torch(t).to(got.dtype)):
                res.problems.append(f"{t.name}: fp32.pt differs from the upcast model weight")
            elif not is_buf:
                res.frozen_ok.append(t.name)
            res.checked += 1
            continue
        missing = [s for s in states if not (pdir / f"{s}.pt").is_file()]
        if missing:
            res.problems.append(f"{t.name}: missing {', '.join(s + '.pt' for s in missing)}")
            continue
        got = _load_state(pdir / "fp32.pt")
        want = to_torch(t)
        if tuple(got.shape) not in (tuple(want.shape), (want.numel(),)):
            res.problems.append(f"{t.name}: fp32 shape {tuple(got.shape)}, source {tuple(want.shape)}")
        elif not _bits_equal(got, want):
            res.problems.append(f"{t.name}: fp32 differs from the master reconstructed from the source")
        for s in ("exp_avg", "exp_avg_sq"):
            st = _load_state(pdir / f"{s}.pt")
            if getattr(st, "numel", lambda: -1)() != want.numel():
                res.problems.append(f"{t.name}: {s}.pt holds {getattr(st, 'shape', '?')}, expected {want.numel()} elements")
        res.checked += 1
    if res.frozen_absent:
        res.notes.append(f"{len(res.frozen_absent)} frozen param(s) absent from the universal checkpoint (ZeRO-3 "
                         f"leaves them out): {', '.join(res.frozen_absent[:5])}")
    res.ok = not res.problems
    return res


# ---------------------------------------------------------------------------------------------
# frozen parameters


def export_frozen(tag_dir, dest, *, names: Optional[list[str]] = None) -> dict[str, Any]:
    """Write the frozen parameters and buffers of ``tag_dir`` (as stored: the training dtype) to a
    safetensors file ``dest`` (temp + fsync + ``os.replace``). Returns {name: shape}."""
    from safetensors.torch import save_file

    from ..export.deepspeed_source import deepspeed_source
    from ..export.sources import to_torch
    from ..formats import torchfile

    tag_dir, dest = Path(tag_dir), Path(dest)
    src = deepspeed_source(tag_dir)
    ms = next((p for p in (tag_dir / "mp_rank_00_model_states.pt", tag_dir / "zero_pp_rank_0_mp_rank_00_model_states.pt")
               if p.is_file()), None)
    buffers: set[str] = set()
    if ms is not None:
        obj = torchfile.read(ms).obj
        if isinstance(obj, dict):
            buffers = {str(b) for b in (obj.get("buffer_names") or [])}
    tensors = {}
    for t in src.tensors:
        if t.tied_to or not (t.frozen or t.name in buffers):
            continue
        if names is not None and t.name not in names:
            continue
        tensors[t.name] = to_torch(t).contiguous().clone()
    if not tensors:
        return {}
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    _umask_mode(fd)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": "pt", "source": str(tag_dir), "written_by": "ckpt-tui universal"})
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    except BaseException:
        _unlink(tmp)
        raise
    return {k: tuple(v.shape) for k, v in tensors.items()}


# ---------------------------------------------------------------------------------------------
# subprocess with a watchdog

# argv: PARENT_PID CMD...  Runs CMD in our process group (we are its leader: start_new_session);
# SIGKILLs the group when the parent goes away or we are signalled.
_WATCHDOG = r"""
import ctypes, os, signal, subprocess, sys
parent = int(sys.argv[1]); cmd = sys.argv[2:]
def killgroup(*_):
    try:
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(137)
for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
    signal.signal(s, killgroup)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    killgroup()
def pdeath():
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)
p = subprocess.Popen(cmd, preexec_fn=pdeath, stdin=subprocess.DEVNULL)
while True:
    try:
        rc = p.wait(timeout=0.25)
        break
    except subprocess.TimeoutExpired:
        if os.getppid() != parent:
            killgroup()
me = os.getpid()
for d in os.listdir("/proc"):
    if d.isdigit() and int(d) != me:
        try:
            if os.getpgid(int(d)) == me:
                os.kill(int(d), signal.SIGKILL)
        except OSError:
            pass
sys.exit(rc if rc >= 0 else 128 - rc)
"""


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _count_state_files(zdir: Path) -> int:
    n = 0
    try:
        with os.scandir(zdir) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    try:
                        n += sum(1 for x in os.listdir(e.path) if x.endswith(".pt"))
                    except OSError:
                        pass
    except OSError:
        return 0
    return n


def _snapshot(tag_dir: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in sorted(tag_dir.iterdir()):
        st = p.stat()
        out[p.name] = (st.st_size, st.st_mtime_ns)
    return out


def _fsync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask_mode(fd: int) -> None:
    """mkstemp creates 0600 files; give ours the mode a plain open() would (0666 & ~umask)."""
    um = os.umask(0)
    os.umask(um)
    try:
        os.fchmod(fd, 0o666 & ~um)
    except OSError:
        pass


def _unlink(p) -> None:
    try:
        os.unlink(p)
    except OSError:
        pass


def write_latest(folder: Path) -> Path:
    """``latest_universal`` naming ``folder``, in its parent (temp + fsync + os.replace)."""
    parent = folder.parent
    dest = parent / "latest_universal"
    fd, tmp = tempfile.mkstemp(prefix=".latest_universal.", suffix=".tmp", dir=parent)
    try:
        _umask_mode(fd)
        with os.fdopen(fd, "w") as fh:
            fh.write(folder.name)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
        _fsync_dir(parent)
    except BaseException:
        _unlink(tmp)
        raise
    return dest


# ---------------------------------------------------------------------------------------------
# convert


@dataclass
class UniversalResult:
    out: Path
    latest_file: Path
    seconds: float
    files: int
    verification: UniversalVerification
    log_path: Optional[Path]
    frozen: list[str]
    buffers: list[str]
    frozen_file: Optional[Path]
    instructions: str
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"out": str(self.out), "latest_file": str(self.latest_file), "seconds": round(self.seconds, 3),
                "files": self.files, "verification": self.verification.to_json(),
                "log": str(self.log_path) if self.log_path else None, "frozen": self.frozen, "buffers": self.buffers,
                "frozen_file": str(self.frozen_file) if self.frozen_file else None,
                "instructions": self.instructions, "warnings": self.warnings}


def convert_to_universal(plan: UniversalPlan, *, on_progress: Optional[OnProgress] = None, cancel=None,
                         log_path=None, export_frozen_params: Optional[bool] = None) -> UniversalResult:
    """Run DeepSpeed's converter for ``plan``, verify, move into place, write ``latest_universal``.

    The converter's output (tqdm, prints) goes to ``log_path`` (default: a file in the temp folder,
    kept beside the output as ``<out>.convert.log`` only on failure). Raises
    :class:`UniversalError` on failure, :class:`Cancelled` on cancel; either way the temp folder is
    removed, nothing is left under the final name and the source is untouched.
    """
    t0 = time.monotonic()
    out = plan.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UniversalError(f"{out} already exists and is not empty; remove it or choose --out")
    if export_frozen_params is None:
        export_frozen_params = plan.export_frozen
    before = _snapshot(plan.tag_dir)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=out.parent))
    except OSError as e:
        raise UniversalError(f"cannot create a temp folder in {out.parent}: {e.strerror or e}") from None
    inner = tmp / "inner" / out.name
    own_log = log_path is None
    log_file = Path(log_path) if log_path else tmp / "convert.log"
    proc = None
    keep_log_on_failure = out.parent / f"{out.name}.convert.log"
    try:
        (tmp / "inner").mkdir()
        env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
        cmd = [sys.executable, "-c", _WATCHDOG, str(os.getpid()), *plan.command(inner)]
        with open(log_file, "ab") as log:
            log.write(("$ " + " ".join(plan.command(inner)) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=str(tmp), start_new_session=True, close_fds=True)
        total = plan.expected_files
        last = -1
        while True:
            if cancel is not None and cancel.is_set():
                _kill_group(proc)
                raise Cancelled("cancelled")
            try:
                rc = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                pass
            done = min(_count_state_files(inner / "zero"), total)
            if done != last:
                report(on_progress, done, total, "files", "converting")
                last = done
        _kill_group(proc)  # pool workers left behind, if any
        if rc != 0:
            tail = _tail(log_file)
            if own_log:
                shutil.copyfile(log_file, keep_log_on_failure)
            raise UniversalError(f"DeepSpeed's converter failed (exit {rc}): {tail}"
                                 + (f" (full log: {keep_log_on_failure})" if own_log else f" (log: {log_file})"))
        report(on_progress, total, total, "files", "converting")
        if _snapshot(plan.tag_dir) != before:
            raise UniversalError(f"files in {plan.tag_dir} changed during the conversion (a job still writing?); "
                                 "the result was discarded. Convert once the checkpoint is complete")
        report(on_progress, 0, None, "files", "verifying")
        ver = verify_universal(inner, plan.tag_dir, cancel=cancel)
        if not ver.ok:
            raise UniversalError("the converted checkpoint failed verification: " + "; ".join(ver.problems[:5]))
        files = sum(len(fs) for _, _, fs in os.walk(inner))
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled")
        if out.exists():
            if any(out.iterdir()):
                raise UniversalError(f"{out} appeared while converting and is not empty; the result was discarded")
            out.rmdir()
        os.replace(inner, out)
        _fsync_dir(out.parent)
        latest = write_latest(out)
    except BaseException:
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
        elif proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final_log = None
    if own_log:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        final_log = log_file
        shutil.rmtree(tmp, ignore_errors=True)
    frozen_file = None
    if export_frozen_params and (plan.frozen or plan.buffers):
        export_frozen(plan.tag_dir, plan.frozen_file)
        frozen_file = plan.frozen_file
    return UniversalResult(out=out, latest_file=latest, seconds=time.monotonic() - t0, files=files, verification=ver,
                           log_path=final_log, frozen=list(plan.frozen), buffers=list(plan.buffers),
                           frozen_file=frozen_file, instructions=instructions(plan, frozen_file),
                           warnings=list(plan.warnings) + ver.notes)


def _tail(path: Path, n: int = 600) -> str:
    try:
        data = Path(path).read_bytes()[-8000:].decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    lines = [ln for ln in data.splitlines() if ln.strip() and "%|" not in ln]
    for ln in reversed(lines):
        if "Error" in ln or "assert" in ln.lower():
            return ln.strip()[:n]
    return (lines[-1].strip() if lines else "(empty log)")[:n]


# ---------------------------------------------------------------------------------------------
# resume instructions


def frozen_load_code(frozen_file, target: str = "engine.module", zero3: bool = False) -> str:
    """Python that loads ``frozen_file`` into ``target`` (an nn.Module expression)."""
    code = (f"from safetensors.torch import load_file\n"
            f"frozen = load_file({str(frozen_file)!r})\n")
    if zero3:
        code += (f"import deepspeed\n"
                 f"params = [p for n, p in {target}.named_parameters() if n in frozen]\n"
                 f"with deepspeed.zero.GatheredParameters(params, modifier_rank=0):\n"
                 f"    missing, unexpected = {target}.load_state_dict(frozen, strict=False)\n")
    else:
        code += f"missing, unexpected = {target}.load_state_dict(frozen, strict=False)\n"
    code += "assert not unexpected, unexpected\n"
    return code


def instructions(plan: UniversalPlan, frozen_file: Optional[Path] = None) -> str:
    out = plan.out
    ckdir = out.parent
    stage = plan.stage
    ff = frozen_file or plan.frozen_file
    lines = [f"Universal checkpoint: {out}  (latest_universal in {ckdir} names {out.name!r})",
             "",
             "DeepSpeed: add to the DeepSpeed config (any world size; keep ZeRO-"
             + ("1/2" if stage <= 2 else "3") + "):",
             '  "checkpoint": {"load_universal": true}',
             "then, after deepspeed.initialize(...):",
             f"  load_path, client_state = engine.load_checkpoint({str(ckdir)!r})",
             f"  # engine.global_steps == {plan.global_step}"]
    has_frozen = bool(plan.frozen or plan.buffers)
    if has_frozen:
        lines += ["", f"Frozen parameters / buffers ({', '.join((plan.frozen + plan.buffers)[:4])}) are NOT restored by "
                  "load_universal (only optimizer-tracked parameters are)."]
        if frozen_file is None:
            lines.append(f"  Export them first: ckpt-tui universal ... --export-frozen (writes {ff})")
        lines += ["  After engine.load_checkpoint(...) run:"]
        lines += ["    " + ln for ln in frozen_load_code(ff, "engine.module", zero3=stage == 3).splitlines()]
    if plan.framework and "HF Trainer" in plan.framework:
        lines += ["", "HF Trainer:",
                  '  1. put "checkpoint": {"load_universal": true} into the DeepSpeed config you pass as '
                  "TrainingArguments(deepspeed=...)",
                  f"  2. trainer.train(resume_from_checkpoint={str(ckdir)!r})",
                  f"     the Trainer hands that folder to engine.load_checkpoint, which reads latest_universal; the "
                  f"universal folder must stay inside it and its name must start with 'global_step' "
                  f"({out.name!r}: {'ok' if out.name.startswith('global_step') else 'RENAME IT'}).",
                  f"     trainer_state.json (step, epoch, log history) must sit in {ckdir.name}/ (it does); rng_state_<rank>.pth "
                  "too (with a different world size, ranks without a file start from fresh RNG, with a warning); "
                  "the LR scheduler rides in the DeepSpeed model states (scheduler.pt only without DeepSpeed's scheduler)."]
        if has_frozen:
            lines += ["  3. before trainer.train(...), after building the model (from_pretrained of this checkpoint "
                      "folder's model.safetensors also holds them, where it was saved):"]
            lines += ["       " + ln for ln in frozen_load_code(ff, "model").splitlines()]
    elif plan.framework and "Lightning" in plan.framework:
        lines += ["", "Lightning:",
                  '  1. Trainer(strategy=DeepSpeedStrategy(config={..., "checkpoint": {"load_universal": True}}), ...)',
                  f"  2. trainer.fit(model, ckpt_path={str(ckdir)!r})",
                  "     Lightning hands that folder to engine.load_checkpoint, which reads latest_universal there; "
                  "the loops/epoch state comes from the model-states file copied into the universal folder."]
        if has_frozen:
            lines += ["  3. before trainer.fit(...), on your LightningModule (names are relative to it):"]
            lines += ["       " + ln for ln in frozen_load_code(ff, "lightning_module").splitlines()]
    return "\n".join(lines)
