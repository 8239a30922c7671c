"""What ``Node.facts`` holds, declared once per format: the keys each format module may write, their
types and what they mean. The ``inspect --json`` document writes them as they are (insertion order).

Every key is optional (``total=False``): a fact is there when the headers said it. ``facts_type``
names the declaration of a node; tests/unit/test_facts.py inspects every synthetic tree and holds
each node's facts to it; docs/reference/facts.md is generated from the keys and comments declared here
(scripts/write_reference.py; a unit test fails when the page is stale).
"""

from __future__ import annotations

from typing import Optional, TypedDict, Union


class NodeFacts(TypedDict, total=False):
    """What the scan records on any node (scan.py), whatever its format."""

    error: str  # why the file or folder could not be read or is broken, in words
    error_kind: (
        str  # truncated | corrupt | permission | unreadable | loop | broken-link | too-deep | too-many | too-large
    )
    symlink: bool  # reached through a symbolic link
    hard_links: int  # a file with this many names (st_nlink > 1): folder sizes count its bytes once


class SpecialFacts(NodeFacts, total=False):
    """``special``: not a file nor a folder (never opened)."""

    special: str  # "fifo" or "device or socket"


class DirFacts(NodeFacts, total=False):
    """``dir`` (and a scanned root folder of format ``unknown``): a folder holding safetensors shards, its
    index checked against them (safetensors_file.HfModelFolder)."""

    # index_* facts: each name at most 200 characters (a longer one cut, ending "…")
    index_missing_files: list[str]  # shard files the index names that are not here (first 32)
    index_missing_tensors: list[str]  # tensors the index maps to a file that does not hold them (first 32)
    index_unlisted_tensors: list[str]  # tensors the shards hold that the index leaves out (first 32)
    index_outside: list[str]  # index entries pointing outside the folder (first 8)


class TensorFacts(TypedDict, total=False):
    """Totals over the tensors a node holds (format.set_tensor_facts)."""

    param_count: int  # elements of the (model) tensors
    tensor_bytes: int  # bytes of those tensors as stored
    dtypes: list[str]  # their dtypes, most frequent first (torch names without "torch.")
    tensor_count: int  # number of tensors (DCP: of every entry, model and optimizer)


class PickleFacts(NodeFacts, total=False):
    """A pickle read through the restricted unpickler."""

    unsafe_globals: list[
        str
    ]  # globals outside the allowlist the pickle names (never called; first 64, each cut to 200)


class TorchFileFacts(PickleFacts, total=False):
    """A torch.save file whose structure was read (torch_save.read_torch_file)."""

    pickle: str  # "zip" (torch >= 1.6) or "legacy"


class TorchZipFacts(TorchFileFacts, TensorFacts, total=False):
    """``torch-zip``: a torch.save file (``.bin``, ``.pt``, ``.ckpt``, Trainer/Accelerate state files)."""

    keys: list[str]  # its top-level dict keys (first 12; each at most 200 characters, a longer one cut ending "…")
    keys_total: int  # how many top-level keys it has, when there are more than the 12 listed
    weights_under: str  # the key the state dict sits under ("state_dict", "module", ...)
    tied: list[list[str]]  # groups of tensor names viewing one storage (first 16 groups, first 16 names of each)
    global_step: int  # top-level global_step (Lightning)
    iteration: int  # top-level iteration (Megatron)
    epoch: int  # top-level epoch (Lightning)
    object: str  # the class of what it holds when that is not a dict
    save_only_model: bool  # training_args.bin: TrainingArguments.save_only_model (read, never guessed)
    deepspeed: bool  # training_args.bin: the run was given a DeepSpeed config
    metric_for_best_model: str  # training_args.bin: TrainingArguments.metric_for_best_model (at most 200 characters)
    greater_is_better: bool  # training_args.bin: TrainingArguments.greater_is_better


class DeepSpeedModelStatesFacts(TorchFileFacts, total=False):
    """``deepspeed-model-states``: ``*_model_states.pt``, read with its tag folder (rank 0)."""


class DeepSpeedOptimStatesFacts(PickleFacts, total=False):
    """``deepspeed-optim-states``: ``*_optim_states.pt``, read with its tag folder (rank 0)."""


class DcpFacts(PickleFacts, TensorFacts, total=False):
    """``dcp``: a torch.distributed.checkpoint folder (``.metadata`` + ``*.distcp``, or DCP in safetensors
    format). The tensor totals count the model's tensors only (an optimizer-only DCP: its optimizer state's
    bytes and dtypes, ``param_count`` 0); ``tensor_count`` every entry."""

    shard_files: int  # number of shard files (*.distcp, or safetensors files)
    ranks_present: list[int]  # ranks whose shard file is here
    metadata_missing: bool  # shards without .metadata (nor a complete set of rank-local ones)
    world_size: Optional[int]  # ranks that saved it (None: not told by the file names)
    metadata_files: list[str]  # the metadata files read (".metadata" or "__{rank}.metadata")
    metadata_bytes: int  # their size
    rank_local_metadata: bool  # the metadata is rank-local (__{rank}.metadata)
    missing_files: list[str]  # files .metadata names that are not here
    short_files: list[str]  # files shorter than .metadata places data in them
    unreferenced_files: list[str]  # shard files .metadata does not name (another world size)
    storage: str  # "safetensors" for DCP written in safetensors format
    containers: list[str]  # top-level state-dict keys, most frequent first ("model", "optimizer", ...; first 64)
    containers_total: int  # how many top-level keys there are, when more than the 64 listed
    bytes_entries: int  # non-tensor (pickled bytes) entries
    model_tensor_count: int  # a DCP holding model and optimizer: the model's tensors, as export writes them
    split_dims: list[int]  # dimensions along which tensors are split into chunks
    chunk_gaps: list[str]  # tensors whose chunks leave part of them unwritten (the first 8)
    chunk_overlaps: list[str]  # tensors whose chunks overlap (the first 8)
    tensor_parallel: int  # Megatron-Core torch_dist: tensor-parallel size, from Megatron-LM's args, else the splits
    pipeline_parallel: Optional[
        int
    ]  # Megatron-Core torch_dist: pipeline stages, from Megatron-LM's args (None: no args; the chunks do not tell)
    common_state: bool  # Megatron-Core >= 0.19: the common state is a DCP entry (common_state/…), not common.pt
    stacked_layers: int  # Megatron-Core torch_dist: layers stacked along a leading dimension (decoder.layers.…)
    optimizer_gaps: list[str]  # parameters its optimizer's param_groups list without state (the first 16)
    optimizer_gaps_total: int  # how many there are
    to_hf: str  # Llama-family Megatron-Core or torchtitan: "ready" for export --to hf, "config" (needs --config)


class VerlFacts(NodeFacts, TensorFacts, total=False):
    """``verl-fsdp``: a verl FSDP actor/critic folder (``model_world_size_W_rank_R.pt`` + ``optim_…`` +
    ``extra_state_…`` + ``fsdp_config.json``); the tensor totals are the full model's, from rank 0's model file."""

    world_size: Optional[int]  # from the rank files' names (the largest, where several are mixed)
    ranks_present: list[int]  # ranks whose model file is here
    rank_file_worlds: list[int]  # every world size the rank files' names carry (more than one: a stale save)
    config_world_size: int  # world_size in fsdp_config.json
    fsdp_version: int  # FSDP_version in fsdp_config.json (1 or 2)
    missing_files: list[str]  # rank files of the world size that are not here
    sharded_as: str  # "DTensor" or "ShardedTensor": what the model files hold
    hf_config: bool  # huggingface/config.json is there
    tokenizer: bool  # huggingface/ holds a tokenizer


class DeepSpeedZeroFacts(NodeFacts, TensorFacts, total=False):
    """``deepspeed-zero``: a ZeRO tag folder (``global_stepN/``), from rank 0's model and optim states.
    The tensor totals describe the fp32 weights an export rebuilds."""

    universal_checkpoint_info: bool  # the model states carry universal_checkpoint_info (ds_to_universal needs it)
    dp_world_size: int  # data-parallel world size recorded in the model states
    mp_world_size: int  # model-parallel world size recorded in the model states
    global_step: int  # the engine's global_steps
    ds_version: str  # the DeepSpeed version that saved it
    global_samples: int  # the engine's global_samples
    zero_stage: Optional[int]  # ZeRO stage (optim states, else ds_config; 3 if files are per rank)
    train_dtype: str  # "bfloat16" or "float16" when ds_config enables bf16/fp16
    pipeline: bool  # pipeline-parallel (ds_config pipeline stages, or layer_* files)
    shared_params: dict[str, str]  # tied weights: name -> the name it shares
    module_tensors: int  # tensors of the model-states ``module``
    module_params: int  # elements of those tensors, buffers and tied storage counted once
    moe: bool  # a mixture-of-experts checkpoint (num_experts)
    num_experts: list[int]  # mixture of experts: the experts of each MoE layer (model states' num_experts)
    expert_parallel_size: int  # mixture of experts: ranks the experts are spread over (from the partition counts)
    expert_files: int  # mixture of experts: layer_L_expert_E_mp_rank_XX_model_states.pt files present
    partition_count: int  # ways the optimizer states were partitioned
    master_dtype: str  # dtype of the fp32 master weights ("float32")
    optimizer_kind: str  # "bf16-optimizer" or "unknown" when there are no ZeRO flat groups
    optim_prefix: str  # prefix of the optim-states files ("bf16_", "fp16_" or "")
    ranks_present: list[int]  # data-parallel ranks whose optim states are here
    world_size: Optional[int]  # dp_world_size (None: not recorded)
    missing_files: list[str]  # rank files the world size implies that are not here
    extra_rank_files: list[str]  # optim-states files of ranks beyond the world size
    partition_mismatch: int  # partition_count when it differs from the world size
    params_trainable: int  # elements of the optimizer-tracked parameters
    frozen_params: list[str]  # frozen parameters recorded in frozen_param_shapes
    frozen_params_unrecorded: int  # elements of frozen weights ZeRO-1/2 did not record
    module_dtypes: list[str]  # dtypes of the model-states ``module`` tensors
    # "zero" (ZeRO-1/2/3), "zero-0" (stage 0: the optimizer inside the model states), "bf16-optimizer"
    # (BF16_Optimizer: ZeRO-1 + bf16 + fp32 grad accumulation) or "pipeline" (layer_XX-model_states.pt)
    ds_layout: str
    optimizer_class: str  # the optimizer that saved the states: BF16_Optimizer, FP16_UnfusedOptimizer, ...
    pipeline_stages: int  # pipeline-parallel degree (checkpoint_parallel_dimensions.pp_degree)
    layer_files: int  # layer_XX-model_states.pt files of a pipeline


class DeepSpeedUniversalFacts(NodeFacts, TensorFacts, total=False):
    """``deepspeed-universal``: a universal checkpoint (``zero/<param>/fp32.pt``). The tensor totals
    describe the fp32 weights (every ``fp32.pt``, from its data.pkl)."""

    param_folders: int  # folders under zero/ (one per parameter)
    with_optimizer_state: int  # of them, those with exp_avg.pt
    fp32_only: list[str]  # parameter folders without optimizer state (first 32)
    model_state_files: int  # *_model_states.pt files beside zero/
    incomplete_params: list[str]  # parameter folders without fp32.pt (interrupted conversion)
    states: list[str]  # the per-parameter state files present (fp32, exp_avg, exp_avg_sq, step), without .pt


class SafetensorsFacts(NodeFacts, TensorFacts, total=False):
    """``safetensors``: one safetensors file, from its header."""

    header_metadata: dict[str, str]  # the header's __metadata__ (first 8 entries, each cut to 1,024 characters)


class WeightIndexFacts(NodeFacts, total=False):
    """A weight index (``*.safetensors.index.json``, ``pytorch_model.bin.index.json``)."""

    tensor_count: int  # tensors its weight_map names
    shard_files: list[str]  # the files its weight_map names (the first 1,024, each cut to 200 characters)
    shard_files_total: int  # how many files it names, when the list above was cut
    total_size: int  # metadata.total_size


class SafetensorsIndexFacts(WeightIndexFacts, TensorFacts, total=False):
    """``safetensors-sharded-index``: the tensor totals are over the shards beside it."""


class JsonFacts(WeightIndexFacts, total=False):
    """``json``: what ckpt-tui reads from a few JSON files (others: no facts); a
    ``pytorch_model.bin.index.json`` has the weight-index facts. Values copied from the file are bounded
    (plain_files.bounded: strings of at most 1,024 characters, the first 32 items of a list)."""

    global_step: int  # trainer_state.json
    epoch: float  # trainer_state.json
    max_steps: int  # trainer_state.json
    best_model_checkpoint: str  # trainer_state.json
    model_type: str  # config.json
    architectures: list[str]  # config.json
    torch_dtype: str  # config.json (older transformers)
    dtype: str  # config.json
    tie_word_embeddings: bool  # config.json
    peft_type: Optional[str]  # adapter_config.json
    sharded_backend: str  # metadata.json (Megatron torch_dist)
    sharded_backend_version: int  # metadata.json
    common_backend: str  # metadata.json


class BackupFacts(NodeFacts, total=False):
    """``backup``: ``.<name>.ckpt-tui-bak``, the original ``ckpt-tui fix`` kept of a file it rewrote (not read)."""

    backup_of: str  # the name of the file it backs up, beside it
    backup_of_format: str  # that file's format, by its name ("deepspeed-model-states", ...)


class LeftoverFacts(NodeFacts, total=False):
    """``leftover``: a temp or staging file or folder a ckpt-tui writer made and a killed run left (leftovers.py;
    never descended: its size is the sum of what is below)."""

    leftover_of: str  # the command whose next run sweeps it ("ckpt-tui universal", "ckpt-tui export", ...)
    leftover_kind: str  # temp-folder | staging-folder | old-output | lock | temp-file
    leftover_held: bool  # a live run holds it (its lock or pid): leave it
    leftover_out: str  # an export's: the OUT it was for; a repair's: the file it was rewriting
    leftover_restores: str  # an --overwrite's old OUT whose OUT is gone: the next export renames it back to this
    leftover_files: int  # files below the folder (counted up to 100,000)


class TextFacts(NodeFacts, total=False):
    """``text``: a marker file (``latest``, ``latest_universal``, ``latest_checkpointed_iteration.txt``)."""

    names: str  # what it says (first 4 KB, stripped)


Facts = Union[
    NodeFacts,
    SpecialFacts,
    DirFacts,
    TorchZipFacts,
    DeepSpeedModelStatesFacts,
    DeepSpeedOptimStatesFacts,
    DcpFacts,
    DeepSpeedZeroFacts,
    DeepSpeedUniversalFacts,
    SafetensorsFacts,
    SafetensorsIndexFacts,
    JsonFacts,
    TextFacts,
    BackupFacts,
    VerlFacts,
]
