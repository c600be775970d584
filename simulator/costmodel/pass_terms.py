"""The terms a forward pass's time is the sum of: one table, read by ``CostModel.pass_time``.

A term prices either one rank's own work (``RANK``: the ranks run at once and the slowest sets the
pace) or the instance's shared work after it (``INSTANCE``: the MLP side over every rank's tokens,
the collectives). Each returns seconds by report group (a number, or an array over the pass's
steps); its ``category`` says which share of the plan's step time it is. Adding a mechanism's cost
is one entry here: the simulation, the plan's breakdown and the tests all read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .passes import CostModel, PassShape, RankWork

Parts = dict[str, Any]  # report group -> seconds (a number or an array over steps)


class Category(StrEnum):
    """What a part of a pass's time is, for the shares the plan reports."""

    COMPUTE = "compute"
    COMM = "comm"
    SWAP = "swap"
    BACKUP = "backup"


class Scope(Enum):
    RANK = "rank"  # one scheduler's own kernels; the slowest rank paces the pass
    INSTANCE = "instance"  # after the ranks: every rank's tokens together


class Provenance(StrEnum):
    """How a term is priced on the chosen GPU (issue 25's three kinds)."""

    MEASURED = "measured"  # kernels timed on this GPU (the H200 here) and fitted
    DERIVED = "derived"  # another GPU's measurements or a roofline, scaled by this GPU's datasheet rates
    PUBLISHED = "published"  # a published benchmark's or datasheet's figure for this GPU
    INFERRED = "inferred"  # none of the three: a stated assumption (its source says why)


@dataclass(frozen=True)
class PassTerm:
    name: str
    scope: Scope
    category: Category
    price: Callable[[CostModel, PassShape, RankWork | None], Parts]
    how: Callable[[CostModel], tuple[Provenance, str]]  # how it is priced on the cost model's GPU


def _attention_side(c: CostModel, s: PassShape, w: RankWork) -> Parts:
    """The rank's attention-side GEMMs and elementwise ops: at the padded graph batch when the
    pass decodes (CUDA graph), at the extend batch's tokens, or at the real batch of a rank that
    decodes inside an extend pass (no graph). A prompt chunk's attention (the prefill backend) concatenates
    q; a decoding rank's, a verify's or a draft's runs the decode backend (``CostModel.decode_q_concat``)."""
    rows = w.tokens * s.verify if (s.extend or not s.padded) else s.padded
    out = c.attention_fixed(rows, indexer=not s.skip_indexer, q_concat=bool(w.chunks) or c.decode_q_concat)
    pad = sum(c.prefill_q_pad(n) for n, _ in w.chunks) if w.chunks else 0.0
    if pad:  # FlashMLA's sparse prefill on padded heads: the zero fill and copy of q (CostModel.prefill_q_pad)
        out = dict(out)
        out["norms, rope, quantisation"] = out.get("norms, rope, quantisation", 0.0) + pad
    return out


def _rank_moe(c: CostModel, s: PassShape, w: RankWork) -> Parts:
    """Under DeepEP the router and the whole shared expert of every MoE layer on the rank's own
    tokens (``CostModel.rank_moe``), at the rows its attention side runs: the padded graph batch of a
    decode pass, the extend batch's tokens, the real batch of a rank decoding inside an extend pass."""
    rows = w.tokens * s.verify if (s.extend or not s.padded) else s.padded
    out = c.rank_moe(rows)
    if s.extend and out and c.deepep_contiguous(True):  # the rank's FP8 quantisation before the normal dispatch
        out = dict(out)
        out["routed experts"] = out.get("routed experts", 0.0) + c.dispatch_quant(w.tokens)
    return out


def _indexer(c: CostModel, s: PassShape, w: RankWork) -> Parts:
    if s.skip_indexer:  # the layers reuse a top-k computed before (Pass.skip_indexer)
        return {}
    if w.chunks:
        return {"lightning indexer": sum(c.prefill_indexer(n, prior) for n, prior in w.chunks)}
    return {"lightning indexer": c.indexer_all(w.ctx_sum, w.decode, s.verify)}  # IndexShare anchors; DeepSeek-V4 C4 layers


def _sparse_attention(c: CostModel, s: PassShape, w: RankWork) -> Parts:
    if w.chunks:
        return {"sparse attention": sum(c.prefill_attention(n, prior, s.hisparse) for n, prior in w.chunks)}
    # a verify pass: every query position reads its own top-k rows (FlashMLA's sparse decode with s_q positions
    # per request gathers each position's indices; FA3 runs each position as its own sequence: no dedupe across
    # positions; under fa3 the L2 hits between a request's positions are in the measured verify table)
    q = s.verify
    return {"sparse attention": c.attention_all(w.decode * q, w.ctx_sum * q if q > 1 else w.ctx_sum, verify=q)}


def _sparse_attention_how(c: CostModel) -> tuple[Provenance, str]:
    """How a pass's sparse attention is priced. Where SGLang decodes with FlashAttention-3
    (``CostModel.fa3_decode``: BF16 KV on Hopper) the decode, verify and draft passes are priced by FA3's
    own per-shape times, measured on an H100 (``costmodel/fa3_decode.py``): MEASURED there, DERIVED on the
    other Hopper GPUs. Elsewhere (FP8 KV: ``flashmla_kv``; Blackwell) the fitted kernel terms, as before."""
    from .prompt_chunk import FLASHMLA_SPARSE_PREFILL

    kind, src = _kernels(c)
    _, chunks = FLASHMLA_SPARSE_PREFILL.how(c.g)
    if getattr(c, "fa3_decode", False) and c.m.arch != "dsv4":
        from .fa3_decode import FA3_SPARSE_DECODE

        measured, how = FA3_SPARSE_DECODE.how(c.g)
        return (Provenance.MEASURED if measured else Provenance.DERIVED), (
            "decode, verify and draft passes run FlashAttention-3's MLA path in SGLang (nsa_decode_backend 'fa3', "
            f"the BF16-KV Hopper default): {how}; {chunks}")
    return kind, f"{src}; {chunks}"


def _indexer_how(c: CostModel) -> tuple[Provenance, str]:
    """The decode indexer's fitted term (``_kernels``); a prompt chunk's scoring from DeepGEMM's
    ``fp8_mqa_logits`` timed on the H200 (``costmodel/prompt_chunk.py``), except DeepSeek-V4's paged one."""
    kind, src = _kernels(c)
    if c.m.arch == "dsv4":
        return kind, f"{src}; prompt chunks' paged scoring of compressed keys at the FP8 GEMM term (not measured)"
    from .prompt_chunk import MQA_LOGITS

    return kind, f"{src}; {MQA_LOGITS.how(c.g)[1]}"


def _stream_overlap(c: CostModel, s: PassShape, w: RankWork) -> Parts:
    """DeepSeek-V4 at small batch: what the attention preparation's parallel CUDA streams hide of the
    serial sum the attention-side and indexer terms priced (``CostModel.dsv4_stream_overlap``)."""
    if c.m.arch != "dsv4" or s.extend:  # the common case first: a term of every pass
        return {}
    hidden = c.dsv4_stream_overlap(s, w)
    if not np.any(hidden):
        return {}
    return {"multi-stream overlap": -hidden}


def _stream_overlap_how(c: CostModel) -> tuple[Provenance, str]:
    kind, src = _kernels(c)
    return kind, (f"the preparation ops' own terms ({src}), run as SGLang's deepseek_v4.py MQALayer streams them "
                  "(_forward_prepare_multi_stream: q on the main stream; KV, compressor and indexer on their own; "
                  "at most 64 tokens, 128 on Blackwell)")


def _swap_in(c: CostModel, s: PassShape, w: RankWork) -> Parts:
    """HiSparse's swap-in of a decoding rank's missed rows (one launch per layer), less what the
    IndexShare prefetch hides of the shared layers' (``costmodel/indexshare.py``; 0 when off)."""
    if w.chunks or w.missed_rows is None:
        return {}
    batch = w.decode if w.swap_requests is None else w.swap_requests
    if batch <= 0:  # dynamic residency, every request resident: the graph without the swap-in (dual path)
        return {}
    return {"swap-in": c.swap_in(w.missed_rows, batch) - c.prefetch_hidden(s, w)}


def _backup(c: CostModel, s: PassShape, w: RankWork) -> Parts:
    """HiSparse keeps the full KV on the host: each new token's KV (every layer) is copied there,
    a decode step's newest tokens or an extend batch's chunk, ``backup_overlap`` of it hidden."""
    if not s.hisparse:
        return {}
    tokens = w.tokens if s.extend else w.tokens * s.accepted  # speculative: the accepted tokens' KV
    return {"KV backup to host": c.kv_copy_time(tokens) * (1 - c.p.backup_overlap)}


def _mlp_side(c: CostModel, s: PassShape, w: None) -> Parts:
    """Dense MLP layers, the MoE layers and the head over every rank's tokens (without the routed
    GEMMs where DeepGEMM's masked kernel runs them: ``_routed_masked``; in an extend pass under DeepEP the
    routed GEMMs compute each expert's rows rounded up to 128: ``CostModel.deepep_contiguous``)."""
    return c.mlp_groups(s.tokens, s.mlp_rows, s.head_rows, masked=c.deepep_masked(s.extend),
                        aligned=c.deepep_contiguous(s.extend))


def _routed_masked(c: CostModel, s: PassShape, w: None) -> Parts:
    """A DeepEP decode pass's routed gate/up and down GEMMs: SGLang runs DeepEP's low-latency
    kernels and then DeepGEMM's masked grouped GEMM (``masked_gemm``: measured on an H100)."""
    if s.tokens <= 0 or not c.deepep_masked(s.extend):
        return {}
    return c.routed_masked(s.tokens)


def _routed_masked_how(c: CostModel) -> tuple[Provenance, str]:
    from .masked_gemm import MASKED_GROUPED_GEMM as K
    from .pricing import datasheet_rates

    if c.d.a2a_backend.value != "deepep":
        return Provenance.PUBLISHED, (f"not used: moe_a2a_backend {c.d.a2a_backend.value} (the routed experts are "
                                      "in the MLP side's measured grouped-GEMM terms)")
    if c.g.name == K.ref_gpu:
        return Provenance.MEASURED, f"decode passes under DeepEP: {K.source}"
    hbm = datasheet_rates(c.g)[0]
    return Provenance.DERIVED, (f"decode passes under DeepEP: {K.source}; bandwidth x {hbm / K.ref_hbm_bw:.3g} "
                                f"(this GPU's datasheet HBM {hbm / 1e12:.3g} TB/s over the H100's "
                                f"{K.ref_hbm_bw / 1e12:.3g})")


def _collectives(c: CostModel, s: PassShape, w: None) -> Parts:
    """Every layer's collectives (decode: each rank contributes its padded graph batch)."""
    if s.tokens <= 0:
        return {}
    args = (s.biggest, s.tokens, s.padded or None)
    dense = getattr(c.m, "dense_layers", 0)
    if dense and c.d.moe.value == "ep" and c.d.attention.value == "dp" and c.d.dp > 1:
        # under DP attention with an a2a backend the dense layers gather and scatter instead (comm_layer)
        return {"collectives": (c.m.layers - dense) * c.comm_layer(*args, extend=s.extend)
                + dense * c.comm_layer(*args, extend=s.extend, dense=True)}
    return {"collectives": c.m.layers * c.comm_layer(*args, extend=s.extend)}


def _deepep_host_wait(c: CostModel, s: PassShape, w: None) -> Parts:
    """An extend pass under DeepEP: every MoE layer's normal dispatch makes the CPU wait for the
    received token counts before it launches the dispatch kernel, the GPU idle meanwhile
    (``costmodel/host_sync.py``); decode passes run the low-latency kernels in a CUDA graph (no wait)."""
    if not s.extend or s.tokens <= 0 or not c.deepep_normal(s.extend):
        return {}
    from .host_sync import deepep_host_wait_s

    return {"DeepEP host wait": deepep_host_wait_s(c.m.moe_layers)}


def _deepep_host_wait_how(c: CostModel) -> tuple[Provenance, str]:
    from .host_sync import SOURCE

    if c.d.a2a_backend.value != "deepep":
        return Provenance.MEASURED, f"not used: moe_a2a_backend {c.d.a2a_backend.value} (no DeepEP normal dispatch)"
    return Provenance.MEASURED, f"extend passes under DeepEP: {SOURCE} (a host-side cost, not scaled by GPU)"


def _draft_passes(c: CostModel, s: PassShape, w: None) -> Parts:
    """Speculative decoding: the draft model's passes before the verify (``CostModel.draft_time``),
    each priced by this same table on the draft layer's shapes."""
    if not s.drafts or c.spec is None or s.tokens <= 0:
        return {}
    return {"draft passes (MTP layer)": c.draft_time(s)}


def _draft_how(c: CostModel) -> tuple[Provenance, str]:
    kind, src = _gemm_kernels(c)
    return kind, (f"the draft layer's kernels ({src}); passes per step and their shapes from SGLang's "
                  "eagle_worker.py (serving/speculative.py)")


def _kernels(c: CostModel) -> tuple[Provenance, str]:
    """The fitted kernel terms: this GPU's own calibration, or the H200's scaled by datasheet ratios."""
    t = c.terms
    return (Provenance.DERIVED if t.scaled else Provenance.MEASURED), t.source


def _gemm_kernels(c: CostModel) -> tuple[Provenance, str]:
    """``_kernels`` for terms with FP8 GEMMs: on Hopper DeepGEMM's published rates bound them at prefill
    shapes (``CostModel.op_time``)."""
    kind, src = _kernels(c)
    if getattr(c, "deepgemm_fp8", False):
        from .published_kernels import DEEPGEMM_PREFILL

        src += f"; FP8 GEMMs at prefill shapes bounded by {DEEPGEMM_PREFILL.short}"
    return kind, src


def _swap_in_how(c: CostModel) -> tuple[Provenance, str]:
    g, p = c.g, c.p
    copy = (f"rows over {g.link} at link_bw {g.link_bw / 1e9:.3g} GB/s x gather efficiency "
            f"{g.gather_efficiency:.3g} / {g.gather_efficiency_large_rows:.3g} ({g.where})")
    if p.calibrated and not c.terms.scaled:
        return Provenance.MEASURED, f"launch and per-request cost fitted on this GPU ({p.where}); {copy}"
    return Provenance.PUBLISHED, f"launch and per-request cost: {p.source} ({p.where}); {copy}"


def _backup_how(c: CostModel) -> tuple[Provenance, str]:
    return (Provenance.DERIVED, f"each new token's KV over the host link at {c.g.link_bw / 1e9:.3g} GB/s "
            f"({c.g.where}), backup_overlap {c.p.backup_overlap:g} of it hidden ({c.p.where})")


def _collectives_how(c: CostModel) -> tuple[Provenance, str]:
    ic = c.g.interconnect
    if "measured figures from" in ic.source:
        kind = Provenance.MEASURED
    else:
        kind = Provenance.INFERRED if ic.source.lstrip().upper().startswith("INFERRED") else Provenance.PUBLISHED
    if getattr(c, "_internode_ep", False):
        from .collectives import DEEPEP_SOURCE

        cl = c.cluster
        return (Provenance.PUBLISHED, f"{ic.name} inside a node; EP dispatch/combine across {cl.name}'s {cl.nic} "
                f"({cl.nic_bw / 1e9:.3g} GB/s, {cl.nic_latency_us:g} us; {cl.where}) at DeepEP's measured rates: "
                f"{DEEPEP_SOURCE}")
    return kind, f"{ic.name}: {ic.source}"


PASS_TERMS: list[PassTerm] = [
    PassTerm("attention side", Scope.RANK, Category.COMPUTE, _attention_side, _gemm_kernels),
    PassTerm("lightning indexer", Scope.RANK, Category.COMPUTE, _indexer, _indexer_how),
    PassTerm("DeepEP shared expert, router", Scope.RANK, Category.COMPUTE, _rank_moe, _gemm_kernels),
    PassTerm("sparse attention", Scope.RANK, Category.COMPUTE, _sparse_attention, _sparse_attention_how),
    PassTerm("multi-stream overlap", Scope.RANK, Category.COMPUTE, _stream_overlap, _stream_overlap_how),
    PassTerm("swap-in", Scope.RANK, Category.SWAP, _swap_in, _swap_in_how),
    PassTerm("KV backup", Scope.RANK, Category.BACKUP, _backup, _backup_how),
    PassTerm("MLP side", Scope.INSTANCE, Category.COMPUTE, _mlp_side, _gemm_kernels),
    PassTerm("DeepEP routed GEMM", Scope.INSTANCE, Category.COMPUTE, _routed_masked, _routed_masked_how),
    PassTerm("collectives", Scope.INSTANCE, Category.COMM, _collectives, _collectives_how),
    PassTerm("DeepEP host wait", Scope.INSTANCE, Category.COMM, _deepep_host_wait, _deepep_host_wait_how),
    PassTerm("draft passes", Scope.INSTANCE, Category.COMPUTE, _draft_passes, _draft_how),
]
