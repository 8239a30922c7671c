"""safetensors files and their index (``*.safetensors.index.json``), and a Hugging Face model
folder's index checked against its shards: analysed from the JSON headers, exported by byte range,
checked against ``safetensors.safe_open``."""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING, Any, Iterator, Optional, cast

from ...facts import DirFacts, SafetensorsFacts, SafetensorsIndexFacts, WeightIndexFacts
from ...types import Node, Parsed, TensorInfo
from .. import FormatError
from ..format import Described, FileFormat, FolderFormat, Format
from ..plain.format import bounded
from ..torch_save.format import fact_text
from . import header as stfmt

if TYPE_CHECKING:
    from ...export.sources import Source

MAX_INDEX_NAMES = 32  # names an index_* fact lists (each cut to torch_save.MAX_KEY_CHARS)
MAX_SHARD_FILES = 1024  # files an index's shard_files lists (each cut as above; shard_files_total counts them)


class SafetensorsFiles(FileFormat):
    """A ``.safetensors`` file; it names an index too (:class:`SafetensorsIndex` answers for those)."""

    formats = {"safetensors": SafetensorsFacts}
    reference = "safetensors"
    file_layout = "safetensors-file"
    exportable = True
    weights_as_saved = True
    shard_index: Optional[str] = "model.safetensors.index.json"

    def describe(self, node: Node) -> Optional[Described]:
        return (self.file_layout, {"model": node.path}) if self.file_layout and not node.is_dir else None

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        if low.endswith(".safetensors.index.json") or low.endswith(".bin.index.json"):
            # pytorch_model.bin.index.json: read as an index, listed as JSON
            return ("safetensors-sharded-index" if ".safetensors." in low else "json"), "model"
        if low.endswith(".safetensors"):
            return "safetensors", "optimizer" if "optimizer" in low else "model"
        return None

    def analyze(self, node: Node, parsed: Parsed) -> None:
        if node.format == "safetensors":
            h = stfmt.read_header(node.abspath)
            params, nbytes, dtypes, count = h.totals()  # set_tensor_facts, without a TensorInfo per tensor
            cast(SafetensorsFacts, node.facts).update(
                SafetensorsFacts(param_count=params, tensor_bytes=nbytes, dtypes=dtypes, tensor_count=count)
            )
            if h.metadata:
                # keys and values cut as a JSON file's facts are (DCP_SHARDING_INFO is read in full from the header)
                cast(SafetensorsFacts, node.facts)["header_metadata"] = {
                    bounded(k): bounded(v) for k, v in islice(h.metadata.items(), 8)
                }
            return
        # a weight index: model.safetensors.index.json, or pytorch_model.bin.index.json (format json)
        doc = stfmt.read_index(node.abspath)
        wm = doc["weight_map"]
        f = cast(WeightIndexFacts, node.facts)
        f["tensor_count"] = len(wm)
        files = sorted({str(v) for v in wm.values()})
        f["shard_files"] = [fact_text(x) for x in files[:MAX_SHARD_FILES]]
        if len(files) > MAX_SHARD_FILES or any(len(x) > len(fact_text(x)) for x in files[:MAX_SHARD_FILES]):
            f["shard_files_total"] = len(files)  # the list was cut: the folder check reads the index itself
        ts = (doc.get("metadata") or {}).get("total_size") if isinstance(doc.get("metadata"), dict) else None
        if ts is not None:
            f["total_size"] = ts

    def tensors(self, node: Node, parsed: Optional[Parsed] = None) -> Iterator[TensorInfo]:
        p = node.abspath
        if node.format == "safetensors":
            yield from stfmt.read_header(p).tensors
            return
        doc = stfmt.read_index(p)
        for fn in sorted({str(v) for v in doc["weight_map"].values()}):
            fp = p.parent / fn
            if fp.resolve().parent != p.parent.resolve():
                raise FormatError(f"index points outside its folder: {fn}")
            yield from stfmt.read_header(fp).tensors

    def source(
        self,
        node: Node,
        *,
        strip_prefix: Optional[str] = None,
        exclude_frozen: bool = False,
        trust_pickles: bool = False,
    ) -> Source:
        from ...export.sources import strip_names
        from .source import safetensors_source

        return strip_names(safetensors_source(node.abspath), strip_prefix)

    def reference_tensors(self, node: Node, strip_prefix: Optional[str]) -> Iterator[tuple[str, Any]]:
        from safetensors import SafetensorError, safe_open

        from .source import safetensors_source

        files = sorted({r.path for t in safetensors_source(node.abspath).tensors for r in (t.ranges or ())})
        for f in files:
            try:
                with safe_open(f, framework="pt") as st:
                    for k in st.keys():
                        yield k, st.get_tensor(k)
            except SafetensorError as e:  # a message, never "internal error" (the header check above agrees)
                raise FormatError(f"{f}: the safetensors library refuses it: {e}") from None


class SafetensorsIndex(SafetensorsFiles):
    """``model.safetensors.index.json``: named by :class:`SafetensorsFiles`, listed and exported as its shards."""

    formats = {"safetensors-sharded-index": SafetensorsIndexFacts}
    file_layout = "hf-model"  # an index named by itself: the sharded model beside it
    weights_as_saved = False
    shard_index = None

    def classify(self, name: str, low: str) -> Optional[tuple[str, str]]:
        return None

    def describe(self, node: Node) -> Optional[Described]:
        return Format.describe(self, node)


class HfModelFolder(FolderFormat):
    """A folder of safetensors shards: its index must name exactly the files and tensors they hold.
    Adds facts only; the folder keeps format ``dir``."""

    def detect(self, node: Node) -> bool:
        # an index alone too: every file it names may be missing (a copy that stopped before the shards)
        return any(c.name.endswith((".safetensors", ".safetensors.index.json")) for c in node.children)

    def analyze(self, node: Node, parsed: Parsed) -> None:
        names = {c.name for c in node.children}
        idx = [c for c in node.children if c.name.endswith(".safetensors.index.json")]
        if not idx:
            return
        f = cast(DirFacts, node.facts)
        ic = idx[0]
        icf = cast(SafetensorsIndexFacts, ic.facts)
        wm_files = icf.get("shard_files") or []
        if "shard_files_total" in icf:  # the fact was cut (a hostile index): the names in full, from the index
            try:
                wm_files = sorted({str(v) for v in stfmt.read_index(ic.abspath)["weight_map"].values()})
            except (FormatError, OSError):
                pass
        shards = [
            cast(SafetensorsFacts, c.facts)
            for c in node.children
            if c.name in set(wm_files) and "param_count" in c.facts
        ]
        if shards:
            dts: list[str] = []
            for sf in shards:
                dts += [d for d in sf.get("dtypes", []) if d not in dts]
            icf.update(
                SafetensorsIndexFacts(
                    param_count=sum(sf["param_count"] for sf in shards),
                    tensor_bytes=sum(sf.get("tensor_bytes", 0) for sf in shards),
                    dtypes=dts,
                )
            )
        missing = [x for x in wm_files if x not in names]
        if missing:
            f["index_missing_files"] = [fact_text(x) for x in missing[:MAX_INDEX_NAMES]]
        try:
            doc = stfmt.read_index(ic.abspath)
            wm = doc["weight_map"]
            have: dict[str, str] = {}
            for c in node.children:
                if c.name.endswith(".safetensors") and "error" not in c.facts:
                    have.update(dict.fromkeys(stfmt.read_header(c.abspath).names, c.name))
            wrong = [k for k, v in wm.items() if v not in missing and have.get(k) != v]
            unlisted = [k for k in have if k not in wm]
            bad_path = [v for v in set(wm.values()) if "/" in str(v) or str(v).startswith("..")]
            if wrong:
                f["index_missing_tensors"] = [fact_text(k) for k in wrong[:MAX_INDEX_NAMES]]
            if unlisted:
                f["index_unlisted_tensors"] = [fact_text(k) for k in unlisted[:MAX_INDEX_NAMES]]
            if bad_path:
                f["index_outside"] = [fact_text(v) for v in sorted(bad_path)[:8]]
        except (FormatError, OSError):
            pass
