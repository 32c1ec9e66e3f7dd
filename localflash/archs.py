"""What localflash knows about model architectures and drafter kinds, in one place.

Pure data, imported by every layer (``llama/``, ``formats/``, ``speculative/``,
``plan/``, the engine, the registry, bench): nothing here imports anything.
"""

from __future__ import annotations

# -- target architectures ---------------------------------------------------------------

# Plain attention decoders: every block has a KV cache.
DENSE_ARCHS = frozenset({
    "llama", "qwen2", "qwen3", "mistral3", "granite", "phi3", "internlm2", "olmo2", "smollm3",
    "qwen2moe", "qwen3moe", "mixtral", "deepseek", "gptoss", "gemma", "starcoder2", "exaone",
})
# Hybrid archs the planner prices: attention blocks interleaved with Gated-DeltaNet (recurrent) blocks.
HYBRID_ARCHS = frozenset({"qwen35", "qwen35moe", "qwen3next"})
# Sliding-window archs whose pattern llama.cpp hard-codes: n means "every n-th block is global".
SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "cohere2": 4}
# Drafter architectures (a file of one of these is never a target).
DRAFT_ARCHS = frozenset({"dflash", "eagle3"})
# Every arch the planner can price from GGUF metadata alone.
KNOWN_ARCHS = DENSE_ARCHS | HYBRID_ARCHS | frozenset(SWA_PATTERNS) | DRAFT_ARCHS

# Archs with recurrent state (hybrid or pure): a cut of the cache needs n_rs_seq snapshots or a checkpoint.
RECURRENT_ARCHS = frozenset({
    "qwen35", "qwen35moe", "qwen3next", "nemotron_h", "lfm2", "lfm2moe", "falcon-h1", "granitehybrid",
    "jamba", "mamba", "mamba2", "rwkv6", "rwkv7",
})
# llama.cpp honours n_rs_seq only for these (llm_arch_supports_rs_rollback, src/llama-arch.cpp);
# other hybrids (qwen3next, jamba, falcon-h1, ...) get 0 snapshots and go through checkpoint + replay.
SNAPSHOT_ARCHS = frozenset({
    "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "nemotron_h", "nemotron_h_moe", "bailingmoe3",
    "lfm2", "lfm2moe", "kimi-k3", "glm5-next",
})
# Archs whose llama.cpp graph exposes per-layer inputs (t_layer_inp): targets DFlash and EAGLE-3 can tap.
LAYER_INPUT_ARCHS = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp", "gemma4",
    "gpt-oss", "openai-moe", "lfm2", "nemotron_h", "minimax-m2", "mimo2", "deepseek4",
    "bailingmoe3", "hunyuan-vl", "nanbeige", "muse-glimmer", "minimax-01",
})
# Qwen3.5/3.6 attention: the query and its output gate share one projection (twice the query width).
GATED_QUERY_ARCHS = frozenset({"qwen35", "qwen35moe"})

# -- drafter kinds --------------------------------------------------------------------------

LOOKUP = "+ngram"  # suffix of a model drafter kind: prompt lookup is tried first each cycle
MODEL_DRAFTERS = ("dflash", "draft", "eagle3")  # kinds that load a drafter file
# parallel slots: kinds whose slots' drafters share one multi-sequence drafter context (the others: a context a slot)
SLOT_SHARED_DRAFTERS = ("dflash", "draft", "mtp")
BLOCK_ROOM = 16  # DFlash: positions on top of the drafter's context for the noise block of a draft
BASE_KINDS = ("none", "dflash", "draft", "ngram", "eagle3", "mtp")
# what a pair's `kind` (models.toml) and a bench mode may be
KINDS = BASE_KINDS + tuple(k + LOOKUP for k in (*MODEL_DRAFTERS, "mtp"))
# what --spec may be: a kind, or auto (the pair's kind, or guessed from the drafter file)
SPECS = ("auto",) + KINDS
SYNTHETIC = "synthetic"  # a bench mode only (`bench --modes synthetic@ALPHA`), never a --spec: speculative/synthetic.py

MTP_DRAFT_MAX = 3  # llama.cpp's default MTP draft length (common_params_speculative_draft.n_max)
# the longest draft per kind unless --draft-max says otherwise (DFlash: block size - 1 of a 16-token block)
DRAFT_MAX = {"dflash": 15, "draft": 8, "eagle3": 8, "ngram": 8, "mtp": MTP_DRAFT_MAX, "none": 0, SYNTHETIC: 8}
# DSpark files on a DeepSeek-V4 backbone (dflash.hyper_connection.count > 0): refused before loading (plan/fit.py) and by the driver
DSPARK_DSV4_REFUSAL = ("{name} is a DSpark drafter on a DeepSeek-V4 backbone, which localflash does not drive "
                       "(its stages are DSV4 blocks for a deepseek4 target)")
EAGLE3_ENCODE_ROWS = 16  # rows per EAGLE-3 encoder pass: its output buffer holds that many logits rows (priced by plan/)


TREE = "/tree"  # suffix of a bench mode: `dflash/tree15` verifies trees of at most 15 drafted tokens (--tree 15)


def split_tree(mode: str) -> tuple[str, int | None]:
    """A bench mode's drafter kind and tree budget: ``dflash/tree15`` -> (``dflash``, 15); no suffix: None."""
    kind, sep, n = mode.partition(TREE)
    return (kind, int(n)) if sep and n.isdigit() else (mode, None)


def base_kind(kind: str) -> str:
    """The drafter behind a kind or --spec: ``dflash+ngram`` -> ``dflash``."""
    return kind.removesuffix(LOOKUP)


def kind_of_drafter_arch(arch: str | None) -> str:
    """The drafter kind a drafter file of this architecture runs as (any other arch: a draft model)."""
    return arch if arch in DRAFT_ARCHS else "draft"
