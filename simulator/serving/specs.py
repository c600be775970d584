"""Typed, frozen, validated descriptions of what a serving scenario is made of: the model, the GPU
(with its interconnect), the deployment, the HiSparse config, the workload and the cost-model
parameters.

Every spec checks itself in ``__post_init__`` and names the file and key in its error, so a preset
with ``layers = 0`` or ``gpus = 0`` is a one-line error, never a division by zero deep inside the
simulation. The ``where`` field (the file a spec came from) takes no part in comparisons.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from ..costmodel.collectives import Interconnect
from ..errors import HisparseError


class Mode(StrEnum):
    """What the instance runs: prefill and decode (``colocated``) or decode only (``pd-decode``,
    SGLang's ``--disaggregation-mode decode``: requests arrive with their KV already written)."""

    COLOCATED = "colocated"
    PD_DECODE = "pd-decode"


class Attention(StrEnum):
    """How attention is parallelised inside an instance: ``dp`` (``--enable-dp-attention``: a
    scheduler and a KV pool per DP rank) or ``tp`` (heads split over the instance's GPUs, the MLA
    latent KV replicated on each, one scheduler for the instance)."""

    DP = "dp"
    TP = "tp"


class MoeLayout(StrEnum):
    """How routed experts are spread over an instance's GPUs: ``tp`` (every GPU holds a 1/tp slice
    of every expert; SGLang's layout without ``--ep-size``/``--moe-a2a-backend``) or ``ep`` (whole
    experts, E/tp per GPU, tokens dispatched all-to-all)."""

    TP = "tp"
    EP = "ep"


class MoeA2ABackend(StrEnum):
    """SGLang's ``--moe-a2a-backend``: how tokens reach the experts of an ``ep`` layout. ``deepep``:
    DeepEP, whose ``--deepep-mode auto`` runs its normal kernels in an extend pass and its
    low-latency kernels in a decode pass (``layers/moe/utils.py`` ``DeepEPMode.resolve``), the
    routed experts then as DeepGEMM's masked grouped GEMM (``moe_runner/deep_gemm.py``, the
    ``deepep_ll`` -> ``deep_gemm`` permute); ``none``: no a2a backend; ``auto`` (the default):
    ``deepep`` under ``moe = "ep"`` (the launch command this planner writes), else ``none``."""

    AUTO = "auto"
    DEEPEP = "deepep"
    NONE = "none"


class PoolProfile(StrEnum):
    """Which SGLang memory profiler sizes the KV pool (``pool_configurator._compute_cell_size``).

    ``since-31992``: a token slot costs the real MLA row (656 B FP8, 1152 B bf16) plus, under
    HiSparse, ``host_to_device_ratio`` indexer rows, because the indexer key buffer is sized for the
    whole logical pool (``index_buf_size = size * host_to_device_ratio``); sgl-project/sglang PR
    #31992 "correct DSA KV memory budget", 2026-07-27. ``before-31992``: releases before it (the
    blog's: main at 2026-04-10) count the MLA row as ``kv_lora_rank + qk_rope_head_dim`` elements of
    the KV dtype (576 B for FP8 rows of 656) and one indexer row even under HiSparse, so the pool
    comes out larger and what the buffers allocate beyond the budget is taken from the
    ``1 - mem_fraction_static`` slack."""

    SINCE_31992 = "since-31992"
    BEFORE_31992 = "before-31992"


class IndexerCache(StrEnum):
    """Which SGLang release builds the lightning indexer of an IndexShare model (GLM-5.2: 21 anchor,
    57 shared layers). ``since-30531``: only the layers that run the indexer build an ``Indexer``
    module and own index-K rows in the pool and in the profile's cell (sgl-project/sglang PR #30531
    "[DSA] Skip indexer KV cache for skip-topk layers", merged after 2026-08-14: its A/B on
    GLM-5.2-NVFP4 gives 55,225 -> 47,702 B per token, weights 107.74 -> 106.76 GB per rank).
    ``before-30531``: every layer builds an ``Indexer`` (``DeepseekV2AttentionMLA``; the shared
    layers' weights are allocated, uninitialised and never run: PR #30922) and ``DSATokenToKVPool``
    allocates, and ``_compute_cell_size`` charges, index-K rows on every layer (PR #30041: "dead
    VRAM at 132 B/token/layer"). Models without shared layers are the same under both."""

    SINCE_30531 = "since-30531"
    BEFORE_30531 = "before-30531"


class KvTransfer(StrEnum):
    """How a PD deployment's prefill side sends a request's KV to the decode host over RDMA
    (``serving/cluster.py`` prices it): ``none`` (arrives with the prefill's end, the model before
    multi-node deployments), ``layer-wise`` (each layer's KV sent as soon as that layer is prefilled,
    overlapping the later layers' compute: Mooncake Transfer Engine's layer-wise streaming) or
    ``whole-request`` (sent after the last layer: NIXL's read of the finished request in vLLM's
    NixlConnector, SGLang's per-chunk send of a one-chunk prompt)."""

    NONE = "none"
    LAYER_WISE = "layer-wise"
    WHOLE_REQUEST = "whole-request"


class Arrival(StrEnum):
    """Closed loop (each client sends its next request when the last finishes) or open (Poisson)."""

    CLOSED = "closed"
    OPEN = "open"


def num(*, gt: float | None = None, ge: float | None = None, le: float | None = None, default: Any = dataclasses.MISSING,
        help: str = "") -> Any:
    """A numeric field with its domain; the spec's ``__post_init__`` checks it."""
    kw = {} if default is dataclasses.MISSING else {"default": default}
    return field(metadata={"gt": gt, "ge": ge, "le": le, "help": help}, **kw)


@dataclass(frozen=True)
class Spec:
    """Base of every spec: coerces TOML numbers to the annotated type, checks each numeric field's
    domain and the enums, then the subclass's cross-field rules (``_check``)."""

    kind: ClassVar[str] = "spec"
    # keys earlier releases read, with what replaced them: a file that still sets one is told why
    retired: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        where = getattr(self, "where", f"<{self.kind}>")
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            if f.name == "where":
                continue
            value = getattr(self, f.name)
            typ = hints[f.name]
            try:
                value = _coerce(value, typ)
            except _TableEntryError as exc:  # names the table's entry, not the whole table
                raise HisparseError(f"{where}: [{f.name}] {exc}") from None
            except (TypeError, ValueError) as exc:
                raise HisparseError(f"{where}: {f.name} = {_shown(value)}: {exc}") from None
            object.__setattr__(self, f.name, value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                m = f.metadata
                if not math.isfinite(value):
                    raise HisparseError(f"{where}: {f.name} = {value} must be a finite number")
                bad = ((m.get("gt") is not None and not value > m["gt"]) or
                       (m.get("ge") is not None and not value >= m["ge"]) or
                       (m.get("le") is not None and not value <= m["le"]))
                if bad:
                    raise HisparseError(f"{where}: {f.name} = {value} must be {_domain(m)}")
        self._check(where)

    def _check(self, where: str) -> None:
        """Cross-field rules; subclasses raise HisparseError naming ``where`` and the keys."""


def _domain(m: Mapping[str, Any]) -> str:
    parts = []
    if m.get("gt") is not None:
        parts.append(f"> {m['gt']:g}")
    if m.get("ge") is not None:
        parts.append(f">= {m['ge']:g}")
    if m.get("le") is not None:
        parts.append(f"<= {m['le']:g}")
    return " and ".join(parts)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        import typing

        _HINTS[cls] = typing.get_type_hints(cls, globalns=globals())
    return _HINTS[cls]


MAX_WHOLE = 2**53  # the largest whole number a float holds exactly: every count the model multiplies


def _shown(value: Any) -> str:
    """A value as an error message quotes it: 10**17 as 1.000e+17, a 400-digit integer by its length, not its digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**15:
        return f"{value:.3e}" if abs(value) < 10**300 else f"an integer of {len(str(abs(value)))} digits"
    return repr(value)


class _TableEntryError(ValueError):
    """One entry of a table-of-strings field is of another type."""


def _coerce(value: Any, typ: Any) -> Any:
    if isinstance(typ, type) and issubclass(typ, StrEnum):
        try:
            return typ(value)
        except ValueError:
            raise ValueError(f"must be one of {', '.join(m.value for m in typ)}") from None
    if typ is bool:
        if not isinstance(value, bool):
            raise ValueError("not true/false")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("not a whole number")
        if isinstance(value, float) and not value.is_integer():
            raise ValueError("not a whole number")
        if abs(value) > MAX_WHOLE:
            raise ValueError(f"must be at most 2**53 ({MAX_WHOLE:,}): past it the model's float arithmetic "
                             "is no longer exact")
        return int(value)
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("not a number")
        return float(value)
    if typ is str:
        if not isinstance(value, str):
            raise ValueError("not a string")
        return value
    if typing.get_origin(typ) is Mapping and typing.get_args(typ) == (str, str):
        if not isinstance(value, Mapping):
            raise ValueError("not a table")
        bad = [k for k, v in value.items() if not isinstance(v, str)]
        if bad:  # a [sources] entry is a citation: a number there is a slip, not a source
            raise _TableEntryError(f"{bad[0]} = {_shown(value[bad[0]])}: not a string (a table of strings)")
        return value
    return value


FP8_BLOCK_SCALE = 1 + 4 / (128 * 128)  # FP8 e4m3 weight + one fp32 scale per 128x128 block (model_shapes.md)


class TensorClass(StrEnum):
    """The weight tensors a checkpoint may store in different formats."""

    ATTENTION = "attention"  # MLA projections and the lightning indexer's
    DENSE = "dense"  # the first dense layers' MLPs
    SHARED_EXPERT = "shared_expert"
    ROUTED_EXPERT = "routed_expert"
    EMBEDDING = "embedding"  # embed_tokens and lm_head


@dataclass(frozen=True)
class ModelSpec(Spec):
    """A DSA MLA MoE model (DeepSeek-V3.2, GLM-5.x). Shape keys are the config.json values (cited
    in each preset); parameter counts and weight bytes are derived from them."""

    kind: ClassVar[str] = "model"
    name: str
    # at most 10,000: released models stay far below (DeepSeek-V3.2 61, GLM-5.x 78, Llama-3.1-405B 126), and
    # the per-layer tables (IndexShare groups, a plan's trace of layers x 128 steps x top-k) grow with it
    layers: int = num(ge=1, le=10_000, help="decoder layers (config.json num_hidden_layers / n_layers)")
    dense_layers: int = num(ge=0, help="leading dense-MLP layers (first_k_dense_replace)")
    attention_heads: int = num(ge=1, help="MLA attention heads (num_attention_heads)")
    hidden_size: int = num(ge=1, help="model width (hidden_size)")
    q_lora_rank: int = num(ge=1, help="MLA query low-rank dimension")
    kv_lora_rank: int = num(ge=1, help="MLA latent KV dimension (the cached row's nope part)")
    qk_nope_head_dim: int = num(ge=1, help="per-head query/key dimension without rope")
    qk_rope_head_dim: int = num(ge=1, help="per-head rope dimension (cached beside the latent)")
    v_head_dim: int = num(ge=1, help="per-head value dimension")
    dense_intermediate_size: int = num(ge=1, help="dense MLP intermediate size (intermediate_size)")
    moe_intermediate_size: int = num(ge=1, help="one expert's intermediate size")
    experts: int = num(ge=1, help="routed experts per MoE layer (n_routed_experts)")
    experts_per_token: int = num(ge=1, help="routed experts each token uses (num_experts_per_tok)")
    shared_experts: int = num(ge=0, help="shared experts per MoE layer (n_shared_experts)")
    vocab_size: int = num(ge=1, help="vocabulary size (embedding and lm_head rows)")
    indexer_heads: int = num(ge=1, help="lightning-indexer heads (index_n_heads)")
    indexer_head_dim: int = num(ge=1, help="lightning-indexer head dimension (index_head_dim)")
    top_k: int = num(ge=1, help="tokens sparse attention selects per step (index_topk)")
    kv_row_bytes: int = num(ge=1, help="bytes of one token's MLA KV row per layer (1152 bf16, 656 FP8)")
    indexer_row_bytes: int = num(ge=0, help="bytes of one token's indexer key per layer (132)")
    context_length: int = num(ge=0, default=0, help="max_position_embeddings; 0: unknown")
    # the trace generator's preset fitted to this model's published top-k statistics (traces/presets/,
    # hisparse trace gen --preset): hisparse plan generates its trace from it at the workload's context
    trace_preset: str = ""
    weight_bytes_per_param: float = num(gt=0, default=FP8_BLOCK_SCALE,
                                        help="checkpoint bytes per parameter (FP8 e4m3 + one fp32 scale per 128x128 block)")
    embedding_bytes_per_param: float = num(gt=0, default=2.0)  # embed and lm_head stay bf16 in FP8 checkpoints
    # bytes per parameter of each tensor class where the checkpoint stores it otherwise (scales
    # included; 0: weight_bytes_per_param). NVFP4 checkpoints quantise the routed experts: 0.5625
    # (e2m1 + an FP8 scale per 16 values), MXFP4 0.53125 (an E8M0 scale per 32).
    attention_bytes_per_param: float = num(ge=0, default=0.0, help="MLA and indexer weights")
    dense_bytes_per_param: float = num(ge=0, default=0.0, help="the dense layers' MLPs")
    shared_expert_bytes_per_param: float = num(ge=0, default=0.0, help="shared experts")
    routed_expert_bytes_per_param: float = num(ge=0, default=0.0, help="routed experts")
    # IndexShare (GLM-5.2; config.json index_topk_freq / index_skip_topk_offset): layer l runs its own
    # indexer ("full", an anchor) iff max(l - offset + 1, 0) % freq == 0, else it reuses the top-k of
    # the last anchor before it ("shared"; no indexer weights, no indexer keys). The rule is
    # transformers' GlmMoeDsaConfig / vLLM's deepseek_v32 skip_topk; freq 1: every layer indexes.
    index_topk_freq: int = num(ge=1, default=1, help="config.json index_topk_freq: one indexer per this many layers")
    index_skip_topk_offset: int = num(ge=0, default=0, help="config.json index_skip_topk_offset")
    # config.json index_share_for_mtp_iteration (GLM-5.2: true): under EAGLE with topk 1 the MTP draft runs its
    # indexer on the first draft decode step and reuses that top-k on the later ones (SGLang PR #28192; the
    # reuse engages since PR #29654, merged 2026-06-29, before the cookbook's main @ 09ca4fc)
    mtp_index_share: bool = False
    # DeepSeek-V4 (arch "dsv4"; config.json keys): per-layer attention kinds from compress_ratios
    # (serving/layer_kinds.py), shared-KV MQA heads of head_dim, a grouped low-rank output
    # projection (o_groups x o_lora_rank), the sliding window, hc_mult hyper-connection streams.
    # The MLA keys (kv_lora_rank, qk_nope_head_dim, v_head_dim) are then not used.
    arch: str = "mla"  # "mla" (DeepSeek-V3.2, GLM-5.x) or "dsv4"
    compress_ratios: tuple[int, ...] = ()  # config.json compress_ratios, the backbone's num_hidden_layers entries
    head_dim: int = num(ge=0, default=0, help="dsv4: head_dim (one shared K=V head)")
    o_lora_rank: int = num(ge=0, default=0, help="dsv4: o_lora_rank")
    o_groups: int = num(ge=0, default=0, help="dsv4: o_groups")
    sliding_window: int = num(ge=0, default=0, help="dsv4: sliding_window (raw rows every layer keeps)")
    hc_mult: int = num(ge=0, default=0, help="dsv4: hc_mult (hyper-connection streams)")
    where: str = field(default="<model>", compare=False)

    def _check(self, where: str) -> None:
        if self.arch not in ("mla", "dsv4"):
            raise HisparseError(f"{where}: arch = {self.arch!r}: must be mla or dsv4")
        if not isinstance(self.compress_ratios, (list, tuple)) or not all(
                isinstance(r, int) and not isinstance(r, bool) for r in self.compress_ratios):
            raise HisparseError(f"{where}: compress_ratios must be a list of whole numbers")
        object.__setattr__(self, "compress_ratios", tuple(self.compress_ratios))
        if self.arch == "dsv4":
            from .layer_kinds import RATIO_KIND

            if len(self.compress_ratios) != self.layers:
                raise HisparseError(f"{where}: compress_ratios has {len(self.compress_ratios)} entries for "
                                    f"{self.layers} layers (give the backbone's: config.json lists MTP layers after them)")
            bad = sorted({r for r in self.compress_ratios if r not in RATIO_KIND})
            if bad:
                raise HisparseError(f"{where}: compress_ratios {bad}: known ratios {sorted(RATIO_KIND)}")
            for key in ("head_dim", "o_lora_rank", "o_groups", "sliding_window", "hc_mult"):
                if getattr(self, key) < 1:
                    raise HisparseError(f"{where}: arch = \"dsv4\" needs {key} >= 1")
            if (self.attention_heads * self.head_dim) % self.o_groups:
                raise HisparseError(f"{where}: attention_heads x head_dim must be a multiple of o_groups")
        elif self.compress_ratios:
            raise HisparseError(f"{where}: compress_ratios is a DeepSeek-V4 key: set arch = \"dsv4\"")
        if self.experts_per_token > self.experts:
            raise HisparseError(f"{where}: experts_per_token ({self.experts_per_token}) > experts ({self.experts})")
        if self.dense_layers > self.layers:
            raise HisparseError(f"{where}: dense_layers ({self.dense_layers}) > layers ({self.layers})")

    # -- IndexShare layer groups ----------------------------------------------------------------
    @functools.cached_property
    def anchor_of(self) -> tuple[int, ...]:
        """For each layer, the layer whose indexer top-k it attends with (itself for an anchor)."""
        from ..layer_groups import anchor_map

        return anchor_map(self.layers, self.index_topk_freq, self.index_skip_topk_offset)

    @functools.cached_property
    def anchor_layers(self) -> tuple[int, ...]:
        """The layers that run the lightning indexer (IndexShare's "full" layers)."""
        return tuple(i for i, a in enumerate(self.anchor_of) if a == i)

    @property
    def indexer_layers(self) -> int:
        """Layers that run a lightning indexer: IndexShare anchors (MLA) or C4 layers (DeepSeek-V4)."""
        if self.arch == "dsv4":
            return self.kind_counts.get("c4", 0)
        return len(self.anchor_layers)

    def draft_model(self, layers: int = 1) -> ModelSpec:
        """The MTP / NextN draft as a model of ``layers`` decoder layers of this model's shapes (MoE,
        no dense layer). DeepSeek-V4's MTP layer runs sliding-window attention only, no compressor
        and no indexer (LMSYS day-0 blog, 2026-04-25, "Speculative Decoding": "a separately trained
        DSv4 decoder layer that runs SWA-only attention"), so its layers are SWA kind (ratio 0)."""
        extra: dict[str, Any] = {}
        if self.arch == "dsv4":
            extra["compress_ratios"] = (0,) * layers
        return dataclasses.replace(self, layers=layers, dense_layers=0, **extra)

    # -- layer kinds (serving/layer_kinds.py) ----------------------------------------------------
    @functools.cached_property
    def layer_kinds(self) -> tuple[str, ...]:
        """Each layer's attention kind."""
        if self.arch == "dsv4":
            from .layer_kinds import RATIO_KIND

            return tuple(RATIO_KIND[r] for r in self.compress_ratios)
        return ("dsa",) * self.layers

    @functools.cached_property
    def kind_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.layer_kinds:
            out[k] = out.get(k, 0) + 1
        return out

    @property
    def hisparse_layers(self) -> int:
        """Layers whose rows HiSparse keeps on the host (every DSA layer; DeepSeek-V4's C4 layers)."""
        from .layer_kinds import LAYER_KINDS

        return sum(n for k, n in self.kind_counts.items() if LAYER_KINDS[k].hisparse)

    def host_kv_bytes_per_token(self) -> float:
        """Bytes of one token's rows on HiSparse's host tier, every layer it serves (a DeepSeek-V4 C4
        layer stores a row per 4 tokens)."""
        from .layer_kinds import LAYER_KINDS

        return sum(n * self.kv_row_bytes / LAYER_KINDS[k].compress for k, n in self.kind_counts.items()
                   if LAYER_KINDS[k].hisparse)

    @property
    def shared_layers(self) -> int:
        """Layers that reuse an anchor's top-k (no indexer weights, keys or scoring)."""
        return self.layers - len(self.anchor_layers)

    # -- bytes per token ----------------------------------------------------------------------
    def kv_bytes_per_token(self) -> int:
        return self.layers * self.kv_row_bytes

    def indexer_bytes_per_token(self) -> int:
        return self.indexer_layers * self.indexer_row_bytes

    # -- parameter counts (model_shapes.md, appendix) -------------------------------------------
    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    @property
    def attention_params(self) -> int:
        """MLA weights of one layer: q_a, q_b, kv_a (+rope), kv_b (W_UK + W_UV), o_proj. DeepSeek-V4:
        q_a, q_b, kv_proj (one head), the grouped o_a and o_b, and the layer's two hyper-connection
        maps (transformers DeepseekV4Attention / DeepseekV4HyperConnection; norms, sinks left out)."""
        if self.arch == "dsv4":
            d, h, qr, hd = self.hidden_size, self.attention_heads, self.q_lora_rank, self.head_dim
            hc = 2 * (2 + self.hc_mult) * self.hc_mult * self.hc_mult * d  # attn_hc + ffn_hc .fn
            return d * qr + qr * h * hd + d * hd + h * hd * self.o_lora_rank + self.o_groups * self.o_lora_rank * d + hc
        d, h, qr, kvr = self.hidden_size, self.attention_heads, self.q_lora_rank, self.kv_lora_rank
        nope, rope, v = self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
        return d * qr + qr * h * (nope + rope) + d * (kvr + rope) + self.absorbed_mla_params + h * v * d

    def compressor_params(self, kind: str) -> int:
        """DeepSeek-V4 compressor weights of one layer of ``kind``: kv and gate projections (2 x head_dim
        wide for the overlapping CSA windows, head_dim for HCA); the C4 indexer's are indexer_params."""
        d, hd = self.hidden_size, self.head_dim
        return {"c4": 2 * d * 2 * hd, "c128": 2 * d * hd}.get(kind, 0)

    @property
    def dsv4_attention_extra_params(self) -> int:
        """Every DeepSeek-V4 layer's compressor weights (indexers apart)."""
        return sum(n * self.compressor_params(k) for k, n in self.kind_counts.items()) if self.arch == "dsv4" else 0

    @property
    def absorbed_mla_params(self) -> int:
        """kv_b_proj of one layer (W_UK and W_UV): what SGLang copies into ``w_kc`` / ``w_vc``."""
        if self.arch == "dsv4":
            return 0
        return self.kv_lora_rank * self.attention_heads * (self.qk_nope_head_dim + self.v_head_dim)

    @property
    def indexer_params(self) -> int:
        """Lightning-indexer weights of one layer: wq_b, wk, weights_proj. DeepSeek-V4's: q_b_proj,
        its own compressor's kv and gate projections (2 x index_head_dim), weights_proj."""
        d, ih, idim = self.hidden_size, self.indexer_heads, self.indexer_head_dim
        if self.arch == "dsv4":
            return self.q_lora_rank * ih * idim + 2 * d * 2 * idim + d * ih
        return self.q_lora_rank * ih * idim + d * idim + d * ih

    @property
    def indexer_gate_params(self) -> int:
        """The indexer's ``weights_proj`` (hidden x heads) of one layer, part of ``indexer_params``."""
        return self.hidden_size * self.indexer_heads

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.dense_intermediate_size

    @property
    def expert_params(self) -> int:
        """One routed or shared expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def router_params(self) -> int:
        return self.experts * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """The embedding table; lm_head has as many (weights not tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        attn = (self.layers * self.attention_params + self.indexer_layers * self.indexer_params
                + self.dsv4_attention_extra_params)
        moe = (self.experts + self.shared_experts) * self.expert_params + self.router_params
        return (attn + self.dense_layers * self.dense_mlp_params + self.moe_layers * moe
                + 2 * self.embedding_params)

    @property
    def active_params(self) -> int:
        """Parameters one decoded token multiplies (lm_head included, embedding lookup excluded)."""
        attn = (self.layers * self.attention_params + self.indexer_layers * self.indexer_params
                + self.dsv4_attention_extra_params)
        moe = (self.experts_per_token + self.shared_experts) * self.expert_params + self.router_params
        return (attn + self.dense_layers * self.dense_mlp_params + self.moe_layers * moe
                + self.embedding_params)

    def bytes_per_param(self, tensor: TensorClass | str) -> float:
        """Bytes per parameter of one tensor class as the checkpoint stores it."""
        tensor = TensorClass(tensor)
        if tensor is TensorClass.EMBEDDING:
            return self.embedding_bytes_per_param
        own = getattr(self, f"{tensor.value}_bytes_per_param")
        return own or self.weight_bytes_per_param

    def class_params(self) -> dict[TensorClass, int]:
        """Parameters of each tensor class (the router gates apart: ``router_params``)."""
        return {TensorClass.ATTENTION: (self.layers * self.attention_params + self.indexer_layers * self.indexer_params
                                        + self.dsv4_attention_extra_params),
                TensorClass.DENSE: self.dense_layers * self.dense_mlp_params,
                TensorClass.SHARED_EXPERT: self.moe_layers * self.shared_experts * self.expert_params,
                TensorClass.ROUTED_EXPERT: self.moe_layers * self.experts * self.expert_params,
                TensorClass.EMBEDDING: 2 * self.embedding_params}

    @property
    def weight_bytes(self) -> float:
        """The checkpoint's weights without the MTP layer (HiSparse does not support MTP)."""
        routers = self.moe_layers * self.router_params * self.weight_bytes_per_param
        return routers + sum(n * self.bytes_per_param(c) for c, n in self.class_params().items())


@dataclass(frozen=True)
class GpuSpec(Spec):
    """One GPU: HBM, compute, the host link for the swap-in and the GPU-to-GPU interconnect."""

    kind: ClassVar[str] = "gpu"
    name: str
    hbm_bytes: float = num(gt=0, help="HBM capacity per GPU")
    hbm_bw: float = num(gt=0, help="HBM bandwidth (measured copy or datasheet)")
    bf16_flops: float = num(gt=0, help="dense BF16 tensor-core rate (FP8 is twice it)")
    link: str  # the host link's name, e.g. "PCIe Gen5 x16"
    link_bw: float = num(gt=0, help="host-to-device link bandwidth (pinned memcpy), the swap-in's ceiling")
    gather_efficiency: float = num(gt=0, le=1, help="zero-copy gather of < 1 KiB rows (656 B) / link_bw")
    gather_efficiency_large_rows: float = num(gt=0, le=1, help="zero-copy gather of >= 1 KiB rows (1152 B) / link_bw")
    interconnect: Interconnect
    gpus_per_node: int = num(ge=1, default=8, help="GPUs per node (an instance of more spans nodes)")
    # GPUs one NVLink (or other scale-up) domain joins, the most one tensor-parallel instance may
    # span: the interconnect's collectives are priced within one domain. 0: gpus_per_node
    nvlink_domain_gpus: int = num(ge=0, default=0, help="GPUs of one NVLink domain (0: gpus_per_node)")
    # datasheet rates where hbm_bw / bf16_flops hold measured ones (the H200): the ratios that scale
    # its measured step terms to other GPUs are datasheet over datasheet (costmodel/pricing.py); 0: same
    datasheet_hbm_bw: float = num(ge=0, default=0.0)
    datasheet_bf16_flops: float = num(ge=0, default=0.0, help="datasheet dense BF16 rate where bf16_flops is measured; 0: same")
    fp4_flops: float = num(ge=0, default=0.0, help="dense FP4 tensor-core rate (datasheet); 0: no FP4 tensor cores")
    # the SM boost clock from the vendor's figures (FP32 vector rate / (2 x FP32 cores)): the per-kernel
    # floors measured on the H200 scale to another GPU by the clock ratio (costmodel/pricing.py); 0: no
    # vendor figure, the H200's floors are kept (INFERRED)
    sm_boost_mhz: float = num(ge=0, default=0.0, help="SM boost clock, MHz (vendor FP32 rate / 2 x cores); 0: not published")
    calibration: str = ""  # the packaged calibration that applies to this GPU ("" none)
    # HBM already taken when SGLang measures free memory before loading the weights (CUDA context,
    # torch.distributed / NCCL and custom all-reduce buffers). H200 logs: "Load weight begin. avail
    # mem=138.09 GB" (GiB; sgl-project/sglang#24607, 8xH200 nodes) and 12.25 + 125.65 = 137.9 GiB
    # (SemiAnalysisAI/InferenceX#2128, 8xH200) against 143,771 MiB: 2.48e9 B. Measured on our H200
    # (calibration/startup-memory-h200.txt): CUDA's total is 150.11e9 B (0.64e9 below nvidia-smi's),
    # the context takes 0.65e9, a one-rank NCCL group and cuBLAS 0.78e9 more: 138.47 GiB free, the
    # logs' eight-rank communicators 0.38 GiB more. Other GPUs take the same bytes (INFERRED: the
    # context and communicator buffers do not scale with HBM size).
    startup_bytes: float = num(ge=0, default=2.48e9, help="HBM in use before the weights load")
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)  # per-key source notes
    where: str = field(default="<gpu>", compare=False)

    @property
    def scale_up_gpus(self) -> int:
        """The most GPUs one tensor-parallel instance may span (one NVLink domain)."""
        return self.nvlink_domain_gpus or self.gpus_per_node

    @property
    def free_before_load(self) -> float:
        """What SGLang's profile multiplies by mem_fraction_static (``pre_model_load_memory``)."""
        return max(self.hbm_bytes - self.startup_bytes, 0.0)

    @property
    def fp8_flops(self) -> float:
        """Dense FP8 tensor-core rate: twice the BF16 rate on Hopper and Blackwell (NVIDIA datasheets:
        H200 1,979 vs 989 TFLOP/s, H20 296 vs 148, B200 4.5 vs 2.25 PFLOP/s)."""
        return 2.0 * self.bf16_flops

    def swap_bw(self, row_bytes: int) -> float:
        """Achievable zero-copy gather bandwidth over the host link for rows of this size."""
        eff = self.gather_efficiency_large_rows if row_bytes >= 1024 else self.gather_efficiency
        return self.link_bw * eff


@dataclass(frozen=True)
class DeploymentSpec(Spec):
    """How the GPUs are organised, as SGLang's launch flags say it.

    An *instance* is ``tp`` GPUs (``--tp-size``) that share one copy of the MoE; there are
    ``gpus / tp`` instances. With ``attention = "dp"`` the instance has ``dp`` attention ranks
    (``--dp-size --enable-dp-attention``), each with ``tp / dp`` GPUs, its own scheduler and KV
    pool; with ``attention = "tp"`` the instance has one scheduler and ``dp`` must be 1.
    """

    kind: ClassVar[str] = "deployment"
    name: str
    gpu: str
    gpus: int = num(ge=1)
    tp: int = num(ge=1)
    dp: int = num(ge=1)
    attention: Attention
    mode: Mode
    mem_fraction_static: float = num(gt=0, le=1, help="SGLang --mem-fraction-static")
    host_bytes: float = num(gt=0, help="host memory per node")
    prefill_chunk_tokens: int = num(ge=1, help="SGLang --chunked-prefill-size")
    moe: MoeLayout = MoeLayout.TP
    moe_a2a_backend: MoeA2ABackend = MoeA2ABackend.AUTO  # SGLang --moe-a2a-backend; auto: deepep under moe = "ep" (decode: DeepEP low-latency + DeepGEMM masked GEMM, docs/moe-kernels.md)
    max_total_tokens: int = num(ge=0, default=0, help="SGLang --max-total-tokens per KV pool; 0: derived")
    max_running_requests: int = num(ge=0, default=0, help="SGLang --max-running-requests (whole server); 0: derived")
    prefill_tok_s: float = num(ge=0, default=0.0,
                               help="pd-decode: input tokens/s the prefill side delivers; 0: derived from the cost "
                                    "model (a prefill instance of the same GPUs and layout)")
    page_size: int = num(ge=1, default=64, help="KV pool page size (SGLang's DSA backends use 64)")
    schedule_conservativeness: float = num(
        ge=0, default=1.0, help="SGLang --schedule-conservativeness (default 1.0; x0.3 under DP attention, "
        "server_args._handle_data_parallelism): scales new_token_ratio, the share of each running request's "
        "remaining output the scheduler reserves (admission.py)")
    # SGLang's RadixCache (on unless --disable-radix-cache; HiSparse requires it off, as do the blog's flags).
    # Only admission reads it: PrefillAdder.add_one_req takes the exact ignore_eos look-ahead only when
    # ``req.sampling_params.ignore_eos and getattr(self.tree_cache, "disable", True)``, so with the radix cache on
    # bench_serving's ignore_eos requests are admitted by the new_token_ratio estimate (admission.py). The
    # presets write it where their flags say (false: the model's earlier assumption, kept as the default)
    radix_cache: bool = False
    pool_profile: PoolProfile = PoolProfile.SINCE_31992  # SGLang's memory profiler release: see PoolProfile
    indexer_cache: IndexerCache = IndexerCache.SINCE_30531  # IndexShare's shared layers' indexer: see IndexerCache
    # the --hisparse-config preset this deployment was published with ("": the blog's 8xH200 one),
    # what hisparse plan pairs with it when --hisparse-config is not given
    hisparse: str = ""
    # the cluster preset (simulator/presets/clusters/) the GPUs sit in: nodes, GPUs per node, the NIC; needed
    # when an instance spans nodes (wide EP, DP attention across nodes). "": one node's fabric only
    cluster: str = ""
    prefill_gpus: int = num(ge=0, default=0, help="pd-decode: GPUs of the prefill side; 0: as many as the decode side")
    kv_transfer: KvTransfer = KvTransfer.NONE  # pd-decode: the prefill-to-decode KV transfer over RDMA (KvTransfer)
    where: str = field(default="<deployment>", compare=False)

    def _check(self, where: str) -> None:
        if self.gpus % self.tp:
            raise HisparseError(f"{where}: gpus ({self.gpus}) must be a multiple of tp ({self.tp})")
        if self.attention == Attention.DP and self.tp % self.dp:
            raise HisparseError(f"{where}: with attention = \"dp\", tp ({self.tp}) must be a multiple of dp "
                                f"({self.dp}) (SGLang's DP attention splits an instance's tp GPUs into dp ranks)")
        if self.attention == Attention.TP and self.dp != 1:
            raise HisparseError(f"{where}: with attention = \"tp\", dp must be 1 (one scheduler per instance; "
                                "give more gpus for more instances)")
        if self.moe_a2a_backend == MoeA2ABackend.DEEPEP and self.moe != MoeLayout.EP:
            raise HisparseError(f"{where}: moe_a2a_backend = \"deepep\" needs moe = \"ep\" (DeepEP dispatches "
                                "tokens to whole experts; SGLang sets --ep-size to --tp-size with it)")

    @property
    def a2a_backend(self) -> MoeA2ABackend:
        """The a2a backend in effect (``auto`` resolved: DeepEP under the ``ep`` layout)."""
        if self.moe_a2a_backend != MoeA2ABackend.AUTO:
            return self.moe_a2a_backend
        return MoeA2ABackend.DEEPEP if self.moe == MoeLayout.EP else MoeA2ABackend.NONE

    @property
    def instances(self) -> int:
        return self.gpus // self.tp

    @property
    def attn_tp(self) -> int:
        """GPUs that split one attention rank's heads (SGLang's attn_tp_size)."""
        return self.tp // self.dp if self.attention == Attention.DP else self.tp

    @property
    def ranks_per_instance(self) -> int:
        """Schedulers (KV pools) per instance."""
        return self.dp if self.attention == Attention.DP else 1

    @property
    def ranks(self) -> int:
        """Schedulers (KV pools) in the whole deployment."""
        return self.instances * self.ranks_per_instance


@dataclass(frozen=True)
class HiSparseSpec(Spec):
    """SGLang's ``--hisparse-config`` JSON."""

    kind: ClassVar[str] = "hisparse"
    top_k: int = num(ge=1, help="--hisparse-config top_k: the model's index_topk")
    device_buffer_size: int = num(ge=1, help="--hisparse-config device_buffer_size: hot-buffer slots per request per layer")
    host_to_device_ratio: float = num(ge=1, help="SGLang requires >= 1")
    policy: str = "lru"  # the eviction policy the trace replay runs (SGLang's HiSparse: lru)
    # where a request's full KV lives (serving/residency.py): "swap" (always the host, a hot buffer on the
    # device), "sglang-dynamic" or "vllm-spill" (on the device while the pool allows, demoted under pressure)
    residency: str = "swap"
    # IndexShare prefetch (SGLang PR #29637): the shared layers' swap-in on a side stream while the
    # layers before them compute. SGLang's default on an IndexShare model (GLM-5.2); false is
    # SGLANG_DISABLE_HISPARSE_PREFETCH=1. No effect on a model without shared layers, off under PP.
    prefetch: bool = True
    # DeepSeek-V4's C4 device pool: "token" (SGLang main: the full pool // (4 x host_to_device_ratio)) or
    # "request" (PR #33979, open: a hot buffer per request slot); no effect on other models
    c4_pool: str = "token"
    # how the swap-in copies its rows (serving/swap_designs.py): "fused" (the one launch per layer that
    # the calibration's swap-in terms were fitted on) or "plan" (plan-then-copy: a planning launch, then
    # a full-grid copy; its measured extra fixed cost per layer added)
    swap_in_copy: str = "fused"
    where: str = field(default="<hisparse>", compare=False)

    def _check(self, where: str) -> None:
        from .residency import RESIDENCY_POLICIES

        if self.residency not in RESIDENCY_POLICIES:
            raise HisparseError(f"{where}: residency = {self.residency!r}: unknown (residency policies: "
                                f"{', '.join(RESIDENCY_POLICIES)})")
        if self.c4_pool not in ("token", "request"):
            raise HisparseError(f"{where}: c4_pool = {self.c4_pool!r}: must be token or request")
        from .swap_designs import SWAP_IN_COPY

        if self.swap_in_copy not in SWAP_IN_COPY:
            raise HisparseError(f"{where}: swap_in_copy = {self.swap_in_copy!r}: must be one of "
                                f"{', '.join(SWAP_IN_COPY)}")
        if self.device_buffer_size < self.top_k:
            raise HisparseError(f"{where}: device_buffer_size {self.device_buffer_size} < top_k {self.top_k} "
                                "(HiSparse needs room for a whole step's selection)")
        try:
            from ..replay.policies import POLICY_IDS
        except ImportError:  # the replay package names its policies elsewhere: replay checks it then
            return
        if self.policy not in POLICY_IDS:
            raise HisparseError(f"{where}: policy = {self.policy!r}: unknown (policies: {', '.join(POLICY_IDS)})")


@dataclass(frozen=True)
class WorkloadSpec(Spec):
    kind: ClassVar[str] = "workload"
    name: str
    input_tokens: int = num(ge=1, help="prompt length")
    output_tokens: int = num(ge=1, help="output length (max_new_tokens)")
    length_jitter: float = num(ge=0, le=0.99, help="lengths drawn uniformly within +- this share")
    arrival: Arrival
    rate_per_s: float = num(ge=0, help="open loop: Poisson arrivals, requests/s for the deployment")
    requests_per_client: int = num(ge=1, help="closed loop: requests each client sends; open loop: 16 x this per scheduler in all")
    # bench_serving sends "ignore_eos": not args.disable_ignore_eos (True unless --disable-ignore-eos):
    # every request runs to its max_new_tokens and, with the radix cache off, SGLang admits it through
    # PrefillAdder.add_one_req_ignore_eos (an exact look-ahead); False: the new_token_ratio estimate
    # (requests still run to output_tokens here, so SGLang may retract)
    ignore_eos: bool = True
    # bench_serving's --tokenize-prompt (off by default): the prompts go as token ids and SGLang's
    # TokenizerManager does not tokenize them; off: text, tokenized one request at a time (frontend.py)
    tokenize_prompt: bool = False
    where: str = field(default="<workload>", compare=False)

    def _check(self, where: str) -> None:
        if self.arrival == Arrival.OPEN and self.rate_per_s <= 0:
            raise HisparseError(f"{where}: arrival = \"open\" needs rate_per_s > 0 (--rate needs no arrival = \"open\": "
                                "it runs open loop at each rate it names, whatever the workload's arrival)")
        if self.arrival == Arrival.CLOSED and self.rate_per_s > 0:  # was ignored: the plan ran closed loop
            raise HisparseError(f"{where}: rate_per_s = {self.rate_per_s:g} applies to arrival = \"open\"; this "
                                "workload is closed loop (set arrival = \"open\", or rate_per_s = 0, or give --rate)")


@dataclass(frozen=True)
class CostParams(Spec):
    """The cost terms that are not kernels of the step (those are the measured step terms,
    ``costmodel/pricing.py``): the swap-in's fitted launch and per-request bookkeeping, how much of the
    swap-in and the backup overlap compute. Each carries its source in
    the preset file; terms without one are named in ``unsourced`` and the plan output lists them."""

    kind: ClassVar[str] = "calibration"
    retired: ClassVar[Mapping[str, str]] = {
        "prefill_attention_efficiency": "a prompt chunk's attention is now FlashMLA's sparse prefill as measured on "
                                        "the H200 (simulator/costmodel/prompt_chunk.py); delete the key",
    }
    calibrated: bool
    source: str
    swap_in_launch_us: float = num(ge=0)
    swap_in_overlap: float = num(ge=0, le=1)
    backup_overlap: float = num(ge=0, le=1)
    swap_in_per_request_us: float = num(ge=0, default=0.0)  # swap-in bookkeeping per request per launch
    swap_in_launch_fp8_us: float = num(ge=0, default=0.0)  # 0: swap_in_launch_us
    swap_in_per_request_fp8_us: float = num(ge=0, default=0.0)  # 0: swap_in_per_request_us
    unsourced: tuple[str, ...] = ()  # names of terms with no measurement, datasheet or derivation behind them
    where: str = field(default="<calibration>", compare=False)

    def _check(self, where: str) -> None:
        names = {f.name for f in dataclasses.fields(self)}
        bad = [u for u in self.unsourced if u not in names]
        if bad:
            raise HisparseError(f"{where}: unsourced names unknown term(s) {', '.join(bad)}")
