"""The cost model: ``CostModel.pass_time(Pass)``, the time of one forward pass (decode, mixed or
prefill) of an instance, the sum of the terms in ``pass_terms.PASS_TERMS``; below, what they price.

All GPUs of an instance run each forward pass in lockstep, so a rank's step time is one GPU's time
for its share of every op. A decode step is the sum of its kernels, one after another, each priced by
the term measured for its kind and dtype on the H200 (``costmodel/pricing.py``; scaled by datasheet ratios
on other GPUs), op by op as ``simulator/costmodel/ops.py`` lists them from the model's
shapes and the deployment's layout (``pricing.layout_for``):

- per layer: norms, the fused q_a/kv_a projection, q_b, the absorbed w_kc/w_vc batched GEMMs, rope
  and the KV store, the indexer projections, **the lightning indexer** scoring every context token of
  the rank's requests and selecting the top-k (its own fit), **sparse MLA attention** over the top-k
  rows (launch + roofline / efficiency, fitted), o_proj; the MLP: dense layers, or the router, the
  shared expert and the routed experts as grouped GEMMs at the step's tokens per expert (whole
  experts under EP, each expert's TP slices under the fused MoE: a measured term each);
- once per step: the final norm, the lm_head, the sampler;
- each op's fitted intercept is its fixed cost per launch as timed back to back on the GPU (GEMMs,
  grouped GEMMs) or inside a CUDA graph (elementwise), so a CUDA-graph replay adds nothing more;
- under CUDA graphs (SGLang decode) the batch is padded to the captured size: every GEMM and
  elementwise op of the attention side, the dense layers and the head run on the padded rows; the
  indexer and attention work follow the real requests; routed experts see only real tokens (SGLang
  masks pad rows' top-k ids);
- communication (``collectives.py``): DP attention gathers the instance's tokens before the MLP and
  reduce-scatters after it; TP attention all-reduces after attention and after the MLP; EP
  dispatches and combines tokens all-to-all;
- HiSparse: one swap-in launch per layer (a fixed cost, bookkeeping per request, missed rows over
  the host link) and the newest token's backup to host, each less the share that overlaps compute.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..serving.specs import (
    Attention,
    CostParams,
    DeploymentSpec,
    GpuSpec,
    ModelSpec,
    MoeA2ABackend,
    MoeLayout,
)
from . import dsv4_ops, pass_terms
from .collectives import (
    Collective,
    DeepEPMode,
    deepep_time_s,
    expected_remote_nodes,
    nic_ring_time_s,
)
from .fa3_decode import FA3_SPARSE_DECODE
from .indexshare import LayerTimes, hidden_swap
from .masked_gemm import MASKED_GROUPED_GEMM
from .ops import (
    DEEPEP_NORMAL_EXPERT_ALIGNMENT,
    GROUPED_KINDS,
    INDEXER_LOGITS_BYTES,
    INDEXER_OPS,
    RANK_MOE_OPS,
    Op,
    attention_ops,
    deepep_contiguous_ops,
    deepep_dispatch_quant,
    dense_mlp_ops,
    flashmla_q_pad_ops,
    moe_ops,
    prefill_topk_read_op,
    rank_moe_ops,
    step_head_ops,
)
from .pass_terms import Category, Scope
from .pricing import GpuTerms, datasheet_rates, layout_for, terms_for
from .prompt_chunk import FLASHMLA_SPARSE_PREFILL, MLA_ROW_FLOPS, MQA_LOGITS
from .published_kernels import DEEPGEMM_PREFILL, LIGHTNING_TOPK
from .terms import IndexerTerm, StepTerms

ACT_BYTES = 2  # bf16 hidden states on the wire (SGLang communicates activations in the model dtype)


# SGLang's SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD (environ.py, 0.5.14: 2048): an extend batch whose
# sequences are all at most this long runs dense MHA (MHA_ONE_SHOT) instead of the sparse kernel
DENSE_PREFILL_MAX_KV_LEN = 2048


def sparse_prefill_runs_dense(seq_len: int, hisparse: bool) -> bool:
    """Whether SGLang runs a prompt chunk ending at ``seq_len`` tokens as dense MHA rather than FlashMLA's
    sparse prefill (``dsa_backend.set_dsa_prefill_impl``, 0.5.14: every sequence of the batch at most
    ``DENSE_PREFILL_MAX_KV_LEN`` and no HiSparse coordinator; the batch is taken to be this chunk's)."""
    return not hisparse and seq_len <= DENSE_PREFILL_MAX_KV_LEN


def dispatch_row_bytes(hidden: int) -> int:
    """EP dispatch row: FP8 values + an fp32 scale per 128 channels (DeepEP: FP8 dispatch, BF16 combine)."""
    return hidden + 4 * -(-hidden // 128)


def cuda_graph_batch(batch: int, max_bs: int = 512) -> int:
    """The captured CUDA-graph batch a decode batch is padded to (SGLang server_args
    ``_generate_cuda_graph_batch_sizes``: 1, 2, 4, 8, 12, then steps of 8 to 256, 16 to 496, 32 to
    ``cuda_graph_max_bs``, 512 for tp >= 4 on 90-160 GiB GPUs); beyond the largest, no padding."""
    if batch <= 0:
        return 0
    for size in _GRAPH_SIZES:
        if size >= batch:
            return size if size <= max_bs else batch
    return batch


_GRAPH_SIZES = (1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 497, 16), *range(512, 4097, 32))


# the routed experts' GEMMs that DeepGEMM's masked kernel runs in a DeepEP decode pass, and its term kind
MASKED_OPS = frozenset({"routed_gate_up", "routed_down"})
MASKED_KIND = "grouped_gemm_masked"
# the FP8 GEMM kinds DeepGEMM's published prefill rates bound on Hopper (``CostModel.op_time``): block-FP8
# linears (``fp8_gemm_nt``) and whole routed experts (``m_grouped_fp8_gemm_nt_contiguous``); the TP fused-MoE
# slices are SGLang's Triton kernel, measured here at prefill token counts too
DEEPGEMM_KINDS = frozenset({"gemm", "grouped_gemm"})

REPORT_GROUPS = {
    **{n: "routed experts" for n in ("routed_gate_up", "routed_down", "routed_silu_mul_quant", "moe_combine",
                                     "moe_align_sort", "ep_scatter", "routed_act_quant")},
    **{n: "attention-side GEMMs" for n in ("qkv_a_proj", "q_b_proj", "o_proj", "indexer_wq_b", "indexer_wk",
                                           "indexer_weights_proj")},
    "w_kc_absorbed": "absorbed bmm", "w_vc_absorbed": "absorbed bmm",
    **{n: "shared expert, router, dense MLP" for n in ("shared_gate_up", "shared_down", "shared_silu_mul",
                                                       "router_gate", "router_topk", "dense_gate_up", "dense_down",
                                                       "silu_mul_quant")},
    "indexer_score_topk": "lightning indexer", "sparse_attention": "sparse attention",
    "lm_head": "lm_head, sampler", "sampler": "lm_head, sampler", "final_norm": "lm_head, sampler",
    **dsv4_ops.REPORT_GROUPS,
}


@dataclass(frozen=True)
class RankWork:
    """What one scheduler (attention rank) runs in a pass: an extend batch of prompt ``chunks``
    ``(tokens, prior context)``, or a decode step of ``decode`` requests whose contexts sum to
    ``ctx_sum`` (a number, or an array over the pass's consecutive steps). ``missed_rows``: under
    HiSparse the top-k rows its requests miss over all layers (per step); None: no host tier."""

    decode: int = 0
    ctx_sum: Any = 0.0
    missed_rows: Any = None
    chunks: tuple[tuple[int, int], ...] = ()
    # dynamic residency: requests of the batch in swap mode (the swap-in's per-request bookkeeping; 0: every
    # request is resident and the decode graph without the swap-in runs); None: all ``decode`` of them
    swap_requests: int | None = None

    @property
    def busy(self) -> bool:
        return bool(self.chunks) or self.decode > 0

    @property
    def tokens(self) -> int:
        return sum(n for n, _ in self.chunks) if self.chunks else self.decode


@dataclass(frozen=True)
class Pass:
    """One forward pass of an instance: every scheduler's work (idle ones included), whether the
    host tier is on (HiSparse backs each new token's KV up to host), and how many consecutive
    decode steps of the same batches it prices at once (array terms: one entry per step)."""

    ranks: tuple[RankWork, ...]
    hisparse: bool = False
    steps: int = 1
    # speculative decoding (``serving/speculative.py``): a decode pass is a target verify over
    # ``verify`` query positions per request, ``accepted`` tokens kept per request (their KV backed
    # up to host), and with ``drafts`` the draft model's passes before it (``CostModel.spec``)
    verify: int = 1
    accepted: Any = 1.0
    drafts: bool = False
    # the layers reuse a top-k computed before (no indexer projections, keys or scoring): the MTP draft's
    # later decode steps under config.json index_share_for_mtp_iteration (``CostModel.draft_time``)
    skip_indexer: bool = False

    @classmethod
    def uniform(cls, batch: int, ctx_per_request: Any, ranks: int, *, hisparse: bool = False,
                missed_rows: Any = None, steps: int = 1) -> Pass:
        """A decode pass with ``batch`` requests at ``ctx_per_request`` tokens on each of ``ranks``
        schedulers (``missed_rows`` per rank)."""
        ctx = batch * np.asarray(ctx_per_request, dtype=float)
        return cls((RankWork(batch, ctx, missed_rows),) * ranks, hisparse, steps)

    @property
    def extend(self) -> bool:
        """Some rank runs an extend batch: no CUDA graph for the whole instance (SGLang replays
        graphs only when every DP rank decodes)."""
        return any(r.chunks for r in self.ranks)


@dataclass(frozen=True)
class PassShape:
    """What every term of a pass reads besides its rank's work: the instance's tokens, the CUDA
    graph's padded rank batch (decode), the MLP's and head's rows, the largest rank batch."""

    extend: bool
    hisparse: bool
    tokens: float  # every rank's tokens (the MLP's real rows)
    biggest: int  # the largest rank batch (its tokens)
    padded: int  # decode: the captured graph batch of the largest rank; extend: 0
    mlp_rows: float | None  # dense MLP rows (decode: every rank padded); None: the real tokens
    head_rows: float | None  # lm_head rows (extend: decoding requests and one per extend request)
    verify: int = 1  # query positions per decoding request (speculative verify: 1 + drafts)
    accepted: Any = 1.0  # tokens each decoding request keeps (speculative: the accept length)
    drafts: bool = False  # price the draft model's passes (Pass.drafts)
    work: tuple = ()  # every rank's work (the draft passes re-run it on the draft model)
    steps: int = 1  # consecutive steps the pass prices (Pass.steps)
    skip_indexer: bool = False  # no indexer runs (Pass.skip_indexer)

    @classmethod
    def of(cls, cost: CostModel, p: Pass) -> PassShape:
        busy = [r for r in p.ranks if r.busy]
        tokens = float(sum(r.tokens for r in busy))
        biggest = max((r.tokens for r in busy), default=0)
        spec = dict(accepted=p.accepted, drafts=p.drafts, work=p.ranks, steps=p.steps, skip_indexer=p.skip_indexer)
        if p.extend:
            decode_tokens = sum(r.decode for r in busy if not r.chunks)
            samples = sum(len(r.chunks) for r in busy)
            return cls(True, p.hisparse, tokens, biggest, 0, None, float(decode_tokens + max(samples, 1)), **spec)
        # a verify pass runs every request's q positions; its CUDA graph is captured per request
        # batch with q tokens each (SGLang's target-verify graph: num_tokens_per_bs = num_draft_tokens)
        q = max(1, int(p.verify))
        padded = cuda_graph_batch(biggest) * q
        rows = float(padded * cost.layout.attention_dp)
        return cls(False, p.hisparse, tokens * q, biggest * q, padded, rows, None, verify=q, **spec)


@dataclass(frozen=True)
class StepTime:
    """Seconds of a pass per step (arrays over its ``steps`` consecutive steps), by part: the slowest
    rank's own terms and the instance-wide ones, each part of one ``Category``. A part is stored as
    priced (a number when it does not change over the steps) and read as an array."""

    parts_raw: Mapping[str, Any]
    category: Mapping[str, Category]
    steps: int = 1

    @property
    def parts(self) -> dict[str, np.ndarray]:
        return {k: np.broadcast_to(np.asarray(v, dtype=float), (self.steps,)) for k, v in self.parts_raw.items()}

    def _sum(self, cat: Category | None) -> np.ndarray:
        out = np.zeros(self.steps)
        for k, v in self.parts_raw.items():
            if cat is None or self.category[k] is cat:
                out = out + v
        return out

    @property
    def compute_s(self) -> np.ndarray:
        return self._sum(Category.COMPUTE)

    @property
    def comm_s(self) -> np.ndarray:
        return self._sum(Category.COMM)

    @property
    def swap_s(self) -> np.ndarray:
        return self._sum(Category.SWAP)

    @property
    def backup_s(self) -> np.ndarray:
        return self._sum(Category.BACKUP)

    @property
    def total_s(self) -> np.ndarray:
        return self._sum(None)


FLOORS_TERM = "kernel floors"  # term_sources row for the kernel terms' fixed per-launch parts


class CostModel:
    def __init__(self, model: ModelSpec, gpu: GpuSpec, dep: DeploymentSpec, params: CostParams,
                 terms: GpuTerms | None = None, spec: Any = None, cluster: Any = None, *,
                 prefetch: bool = False, swap_in_extra_us: float = 0.0) -> None:
        self.m, self.g, self.d, self.p = model, gpu, dep, params
        self.swap_in_extra_us = float(swap_in_extra_us)  # a swap-in design's fixed cost beyond the fitted launch
        self.cluster = cluster  # serving.cluster.ClusterSpec when the instance may span nodes (its NIC)
        # IndexShare prefetch of the shared layers' swap-in (costmodel/indexshare.py): SGLang's default
        # with HiSparse on an IndexShare model; off with SGLANG_DISABLE_HISPARSE_PREFETCH and under PP
        self.prefetch = bool(prefetch) and model.shared_layers > 0 and getattr(dep, "pp", 1) == 1
        self.terms = terms or terms_for(gpu)
        self.t: StepTerms = self.terms.terms
        self.layout = layout_for(dep, model)
        self._fixed_cache: dict[tuple, float] = {}
        self.spec = spec  # serving.speculative.SpeculativeSpec, or None
        self._draft: CostModel | None = None

    @property
    def draft(self) -> CostModel:
        """The draft model's cost model: GLM's MTP / NextN layer(s), a decoder layer of the target's
        shapes (attention, indexer, MoE; DeepSeek-V4's: SWA attention only, ``ModelSpec.draft_model``)
        with the target's lm_head, on the same GPUs and layout
        (``memory.nextn_weights_per_gpu`` reads its weights the same way); its KV stays on the
        device (no swap-in: PR #37771 keeps the draft KV in its logical GPU space)."""
        if self._draft is None:
            n = self.spec.draft_layers if self.spec is not None else 1
            one = dataclasses.replace(self.m.draft_model(n), name=f"{self.m.name} draft")
            if hasattr(one, "index_topk_freq"):  # the MTP layer runs its own indexer (no IndexShare group)
                one = dataclasses.replace(one, index_topk_freq=1)
            self._draft = CostModel(one, self.g, self.d, self.p, self.terms)
        return self._draft

    def draft_time(self, s: PassShape):
        """Seconds of the draft model's passes that precede a verify pass (``Pass.drafts``): one
        draft extend over the last step's accepted tokens (its CUDA graph holds ``verify`` tokens
        per request) and ``num_steps - 1`` one-token passes; before a prefill pass, the draft
        layer's own prefill of the same chunks (EAGLE's draft extend after the target's)."""
        ranks = tuple(RankWork(r.decode, r.ctx_sum, None, r.chunks) for r in s.work)
        d = self.draft
        if s.extend:
            return d.pass_time(Pass(ranks)).total_s
        extend = d.pass_time(Pass(ranks, steps=s.steps, verify=s.verify)).total_s
        rest = self.spec.num_steps - 1 if self.spec is not None else 0
        if rest <= 0:
            return extend
        first = d.pass_time(Pass(ranks, steps=s.steps)).total_s
        if not self.m.mtp_index_share or rest == 1:
            return extend + rest * first
        # index_share_for_mtp_iteration: the first draft decode step runs the indexer, the later ones reuse its
        # top-k (SGLang PR #29654: "run the DSA indexer once on the first MTP draft step and reuse its top-k for
        # the remaining steps", topk 1)
        return extend + first + (rest - 1) * d.pass_time(Pass(ranks, steps=s.steps, skip_indexer=True)).total_s

    # -- ops --------------------------------------------------------------------------------------
    def op_time(self, op: Op) -> float:
        """Seconds of one op (all its launches) from its fitted term; FP8 grouped and batched GEMMs,
        whose fits never met their compute roof at decode shapes, are also bounded by the FP8 GEMM
        rate (it matters only at prefill token counts: an extrapolation)."""
        if op.kind == MASKED_KIND:
            hbm, bf16 = datasheet_rates(self.g)
            return MASKED_GROUPED_GEMM.time(op, hbm, 2.0 * bf16)  # dense FP8 = 2 x BF16 (GPU presets)
        t = self.t.op_time(op)
        if op.kind in (*GROUPED_KINDS, "batched_gemm"):
            rate = self.t.rates.get(("gemm", op.dtype))
            if rate is not None:
                t = max(t, (rate.launch_s + op.flops / rate.flops_rate) * op.count)
        if self.deepgemm_fp8 and op.dtype == "fp8" and op.kind in DEEPGEMM_KINDS and op.flops > 0:
            # DeepGEMM's published rate at prefill shapes bounds the fitted term (published_kernels)
            launch = self.t.rates[("gemm", "fp8")].launch_s if ("gemm", "fp8") in self.t.rates else 0.0
            rate = DEEPGEMM_PREFILL.rate(op.n, op.k, grouped=op.kind == "grouped_gemm", fp8_flops=self._fp8_peak)
            t = max(t, (launch + op.flops / rate) * op.count)
        return t

    @property
    def deepgemm_fp8(self) -> bool:
        """SGLang runs its block-FP8 linears and DeepEP's contiguous routed GEMMs with DeepGEMM's SM90 kernels
        here: a Hopper GPU (no FP4 tensor cores), whose published H800 rates bound the FP8 GEMM terms."""
        return self.g.fp4_flops <= 0

    @property
    def _fp8_peak(self) -> float:
        return 2.0 * datasheet_rates(self.g)[1]  # dense FP8 = 2 x dense BF16 (GPU presets)

    def experts_touched(self, instance_tokens: float) -> float:
        """Share of routed experts at least one of the step's tokens uses (uniform routing)."""
        miss = 1.0 - self.m.experts_per_token / self.m.experts
        return 1.0 - miss ** max(float(instance_tokens), 0.0)

    def _rank_tokens(self, batch: float, instance_tokens: float) -> float:
        """Tokens one attention rank computes attention for: its own (DP) or the instance's (TP)."""
        return instance_tokens if self.d.attention == Attention.TP else batch

    def _mlp_batch(self, instance_tokens: float) -> float:
        """The per-rank batch whose MLP side sees ``instance_tokens`` (costmodel.ops multiplies by dp)."""
        return max(float(instance_tokens) / self.layout.attention_dp, 1e-9)

    @property
    def fa3_decode(self) -> bool:
        """Whether SGLang's NSA backend runs a decode, target-verify or draft pass's sparse attention with
        FlashAttention-3 (``nsa_backend.py``: ``forward_decode`` and, for verify / draft extend,
        ``forward_extend`` run ``nsa_decode_backend``): with a BF16 KV cache on Hopper that backend is
        ``fa3`` (``server_args._set_default_nsa_backends``: "Hopper defaults for bfloat16 ...
        nsa_decode_backend = 'fa3'"; the older ``ServerArgs`` default ``nsa_decode_backend: str = "fa3"``).
        FP8 KV runs ``flashmla_kv``, Blackwell ``trtllm`` / ``flashmla_sparse`` (Blackwell here: the GPUs
        with FP4 tensor cores, as ``flashmla_heads``)."""
        return self.m.kv_row_bytes >= 1024 and self.g.fp4_flops <= 0

    @property
    def decode_q_concat(self) -> bool:
        """Whether SGLang's NSA backend concatenates the absorbed q_nope and q_rope before the attention of
        a decode, target-verify or draft pass: not under ``fa3`` (``fa3_decode``), whose ``_forward_fa3``
        passes ``q_rope`` as q and ``q_nope`` as ``qv`` to ``flash_attn_with_kvcache``; FP8 KV
        (``flashmla_kv``) and Blackwell run ``_concat_mla_absorb_q_general`` first. A prompt chunk's
        attention (``flashmla_sparse``) always concatenates."""
        return not self.fa3_decode

    def attention_side_ops(self, padded: int, indexer: bool = True,
                           q_concat: bool = True) -> list[tuple[int, Op]]:
        """(repeat, op) of one rank's attention-side kernels other than the indexer and attention,
        at its (padded) batch: these run on each DP rank's own requests. ``indexer`` False: without
        the indexer's projections (the layers reuse a top-k: ``Pass.skip_indexer``). ``q_concat`` False:
        without the q concatenation (a decode-backend pass that takes q_nope and q_rope apart,
        ``decode_q_concat``)."""
        m = self.m
        if m.arch == "dsv4":  # per layer kind (dsv4_ops.py)
            return [(n, o) for kind, n in m.kind_counts.items() for o in dsv4_ops.layer_ops(m, padded, self.layout, kind)]
        ops = attention_ops(m, padded, 0.0, self.layout, m.kv_row_bytes, q_concat=q_concat)
        # the indexer's projections only on the layers that run it (IndexShare anchors)
        return [(m.indexer_layers if o.name in INDEXER_OPS else m.layers, o) for o in ops
                if o.kind not in ("indexer", "attention") and (indexer or o.name not in INDEXER_OPS)]

    def deepep_masked(self, extend: bool) -> bool:
        """Whether a pass's routed experts run as DeepGEMM's masked grouped GEMM: a decode pass (no
        rank extends) under ``--moe-a2a-backend deepep`` (DeepEP low-latency mode), FP8 experts
        (DeepGEMM's kernel is FP8; other formats keep their measured term)."""
        return (not extend and self.d.a2a_backend == MoeA2ABackend.DEEPEP and self.m.moe_layers > 0
                and self.layout.routed_dtype == "fp8")

    def deepep_normal(self, extend: bool) -> bool:
        """Whether a pass runs DeepEP's normal dispatch (its host wait per MoE layer,
        ``costmodel/host_sync.py``): a pass in which any rank extends under ``--moe-a2a-backend deepep``
        (``--deepep-mode auto`` resolves to normal for the whole pass), whatever the experts' format."""
        return extend and self.d.a2a_backend == MoeA2ABackend.DEEPEP and self.m.moe_layers > 0

    def deepep_contiguous(self, extend: bool) -> bool:
        """Whether a pass's routed experts run DeepEP's normal dispatch into DeepGEMM's contiguous grouped
        GEMM, each local expert's rows rounded up to ``ops.DEEPEP_NORMAL_EXPERT_ALIGNMENT``: a pass in which
        any rank extends (``--deepep-mode auto`` resolves to normal for the whole pass) under
        ``--moe-a2a-backend deepep``, FP8 experts (DeepGEMM's kernel)."""
        return (extend and self.d.a2a_backend == MoeA2ABackend.DEEPEP and self.m.moe_layers > 0
                and self.layout.routed_dtype == "fp8")

    def routed_masked_ops(self, instance_tokens: float) -> list[tuple[int, Op]]:
        """(repeat, op) of the MoE layers' routed gate/up and down GEMMs as DeepGEMM's masked
        kernel prices them (``masked_gemm``): the same shapes and bytes as ``moe_ops``."""
        ops = moe_ops(self.m, self._mlp_batch(instance_tokens), self.layout)
        return [(self.m.moe_layers, dataclasses.replace(o, kind=MASKED_KIND)) for o in ops if o.name in MASKED_OPS]

    def routed_masked(self, instance_tokens: float) -> dict[str, float]:
        """``routed_masked_ops`` by report group (cached)."""
        key = ("masked", float(instance_tokens))
        if key not in self._fixed_cache:
            self._fixed_cache[key] = self._grouped(self.routed_masked_ops(instance_tokens))
        return self._fixed_cache[key]

    def mlp_side_ops(self, instance_tokens: float, rows: float | None = None,
                     head_rows: float | None = None, *, masked: bool = False,
                     aligned: bool = False) -> list[tuple[int, Op]]:
        """(repeat, op) of the kernels that see the whole instance's tokens: dense MLP layers on
        ``rows`` (every rank's padded batch under CUDA graphs; default the tokens), the MoE layers
        on the real tokens (pad rows are masked out of routing), and the head once per step on
        ``head_rows`` (default ``rows``; a prefill chunk samples only a request's last token).
        ``masked``: leave out the routed gate/up and down GEMMs (``routed_masked_ops`` prices them).
        Under DeepEP (``shared_replicated``) the router and the shared expert run on each rank's own
        tokens: ``rank_moe`` prices them for the rank, not here. ``aligned``: the routed GEMMs compute each
        local expert's rows rounded up to DeepEP's normal-dispatch alignment (``deepep_contiguous``)."""
        m, lay = self.m, self.layout
        rows = float(instance_tokens if rows is None else rows)
        head_rows = rows if head_rows is None else float(head_rows)
        out: list[tuple[int, Op]] = []
        if m.dense_layers:
            out += [(m.dense_layers, o) for o in dense_mlp_ops(m, self._mlp_batch(rows), lay)]
        if m.moe_layers:
            align = DEEPEP_NORMAL_EXPERT_ALIGNMENT if aligned else 0
            out += [(m.moe_layers, o) for o in moe_ops(m, self._mlp_batch(instance_tokens), lay, align=align)
                    if not (masked and o.name in MASKED_OPS) and not (lay.shared_replicated and o.name in RANK_MOE_OPS)]
            if aligned:  # DeepEP's normal dispatch into DeepGEMM's contiguous layout: its quantisations and scatter
                out += [(m.moe_layers, o) for o in deepep_contiguous_ops(m, self._mlp_batch(instance_tokens), lay)]
        out += [(1, o) for o in step_head_ops(m, self._mlp_batch(head_rows), lay)]
        return out

    def rank_moe(self, rows: float) -> dict[str, float]:
        """A rank's router and whole shared expert over its own ``rows`` tokens in every MoE layer, by
        report group, under DeepEP (``ops.rank_moe_ops``; empty for other layouts: the MLP side has them)."""
        m, lay = self.m, self.layout
        if not (lay.shared_replicated and m.moe_layers and rows > 0):
            return {}
        key = ("rank-moe", float(rows))
        if key not in self._fixed_cache:
            self._fixed_cache[key] = self._grouped([(m.moe_layers, o) for o in rank_moe_ops(m, rows, lay)])
        return self._fixed_cache[key]

    def dispatch_quant(self, rows: float) -> float:
        """Seconds of every MoE layer's FP8 quantisation of the rank's ``rows`` tokens before DeepEP's normal
        dispatch (``ops.deepep_dispatch_quant``)."""
        return self.m.moe_layers * self.op_time(deepep_dispatch_quant(self.m, rows)) if rows > 0 else 0.0

    def fixed_ops(self, padded: int, instance_tokens: float) -> list[tuple[int, Op]]:
        """(repeat, op) of a decode step's kernels other than the indexer and attention: attention
        side (the decode backend's q handling, ``decode_q_concat``), dense layers and head at the padded rank batch,
        MoE layers at the instance's real tokens."""
        return (self.attention_side_ops(padded, q_concat=self.decode_q_concat)
                + self.mlp_side_ops(instance_tokens, padded * self.layout.attention_dp))

    def _grouped(self, ops: list[tuple[int, Op]]) -> dict[str, float]:
        """Seconds of ``ops`` by report group (``REPORT_GROUPS``)."""
        out: dict[str, float] = {}
        for n, o in ops:
            group = REPORT_GROUPS.get(o.name, "norms, rope, quantisation")
            out[group] = out.get(group, 0.0) + n * self.op_time(o)
        return out

    def attention_fixed(self, rows: int, indexer: bool = True, q_concat: bool = True) -> dict[str, float]:
        """A rank's attention-side GEMMs and elementwise ops at ``rows`` (its padded decode batch,
        or an extend batch's tokens), by report group (``indexer`` False: without the indexer's;
        ``q_concat`` False: without the q concatenation, ``decode_q_concat``)."""
        key = ("att", rows, indexer, q_concat)
        if key not in self._fixed_cache:
            self._fixed_cache[key] = self._grouped(self.attention_side_ops(rows, indexer, q_concat))
        return self._fixed_cache[key]

    def mlp_time(self, instance_tokens: float, rows: float | None = None, head_rows: float | None = None) -> float:
        """Seconds of the instance-wide kernels (dense MLPs, MoE, head) for these tokens."""
        return sum(self.mlp_groups(instance_tokens, rows, head_rows).values())

    def mlp_groups(self, instance_tokens: float, rows: float | None = None,
                   head_rows: float | None = None, *, masked: bool = False, aligned: bool = False) -> dict[str, float]:
        """``mlp_time`` by report group (``masked``: without the routed GEMMs; ``aligned``: DeepEP's
        normal-dispatch row alignment; see ``mlp_side_ops``)."""
        key = ("mlp", float(instance_tokens), rows, head_rows, masked, aligned)
        if key not in self._fixed_cache:
            self._fixed_cache[key] = self._grouped(self.mlp_side_ops(instance_tokens, rows, head_rows, masked=masked,
                                                                     aligned=aligned))
        return self._fixed_cache[key]

    # -- a pass -----------------------------------------------------------------------------------
    def pass_time(self, p: Pass) -> StepTime:
        """Seconds of a forward pass (per step: ``p.steps`` consecutive decode steps at once), the
        one price of every pass the serving model runs. Every rank's own terms (``RANK`` scope in
        ``pass_terms.PASS_TERMS``) run at once and the slowest rank sets the pace, step by step;
        the instance-wide terms follow. The parts are the slowest rank's own and the instance's."""
        shape = PassShape.of(self, p)
        category: dict[str, Category] = {}
        per_rank: list[dict[str, Any]] = []
        totals = []
        for work in p.ranks:
            if not work.busy:
                continue
            parts: dict[str, Any] = {}
            total: Any = 0.0
            for term in pass_terms.PASS_TERMS:
                if term.scope is not Scope.RANK:
                    continue
                for group, sec in term.price(self, shape, work).items():
                    parts[group] = parts.get(group, 0.0) + sec
                    category[group] = term.category
                    total = total + sec
            per_rank.append(parts)
            totals.append(total)
        out: dict[str, Any] = {}
        fast = p.steps == 1 and all((type(x) is float or np.ndim(x) == 0) and x == x for x in totals)
        if per_rank and fast:  # one step, every total a number (a mixed pass): np.argmax's pick, in Python
            best = 0
            for i, x in enumerate(totals):
                if x > totals[best]:
                    best = i
            out.update(per_rank[best])
        elif per_rank:
            slowest = np.argmax(np.stack([np.broadcast_to(np.asarray(x, dtype=float), (p.steps,)) for x in totals]),
                                axis=0)
            if np.all(slowest == slowest[0]):  # one rank is the slowest at every step (the usual case)
                out.update(per_rank[int(slowest[0])])
            else:
                cols = np.arange(p.steps)
                for group in category:
                    stacked = np.stack([np.broadcast_to(np.asarray(parts.get(group, 0.0), dtype=float), (p.steps,))
                                        for parts in per_rank])
                    out[group] = stacked[slowest, cols]
        for term in pass_terms.PASS_TERMS:
            if term.scope is not Scope.INSTANCE:
                continue
            for group, sec in term.price(self, shape, None).items():
                out[group] = out.get(group, 0.0) + sec
                category[group] = term.category
        return StepTime(out, category, p.steps)

    def term_sources(self) -> list[dict[str, str]]:
        """Per term of a pass: its name, how it is priced on this GPU (measured / derived /
        published) and the source."""
        out = []
        for term in pass_terms.PASS_TERMS:
            kind, source = term.how(self)
            out.append({"term": term.name, "priced": kind.value, "source": source})
        kind, source = self.floors_source()
        out.append({"term": FLOORS_TERM, "priced": kind.value, "source": source})
        return out

    def floors_source(self) -> tuple[pass_terms.Provenance, str]:
        """How the kernel terms' fixed per-launch parts (the fitted intercepts every kernel term
        carries) are priced on this GPU: measured with its own calibration; else the H200's scaled by
        the SM boost clock ratio where both GPUs' clocks are published (DERIVED, ``pricing.floor_ratio``),
        or kept as they are (INFERRED)."""
        st = self.t
        gemm = [r.launch_s * 1e6 for (kind, _), r in st.rates.items() if kind != "elementwise"]
        span = (f"{min(gemm):.1f}-{max(gemm):.1f} us per GEMM kind, {st.graph_launch_s * 1e6:.2f} us per graph "
                "node, attention " + " / ".join(f"{v[0] * 1e6:.1f}" for v in st.attention.values()) + " us")
        if not self.terms.scaled:
            return pass_terms.Provenance.MEASURED, f"the fitted per-kernel intercepts of this GPU's calibration ({span})"
        how = self.terms.floor_source or f"the H200's fitted per-kernel intercepts kept on {self.g.name}"
        kind = pass_terms.Provenance.INFERRED if "INFERRED" in how else pass_terms.Provenance.DERIVED
        return kind, f"{how} ({span})"

    def step_report(self, batch: int, ctx_per_request: float) -> dict[str, float]:
        """Milliseconds of one baseline decode step with ``batch`` requests on every scheduler of
        the instance, each at ``ctx_per_request`` tokens, by term group (and the total): the parts
        of ``pass_time``."""
        step = self.pass_time(Pass.uniform(batch, ctx_per_request, self.d.ranks_per_instance))
        out = {group: float(sec[0]) * 1e3 for group, sec in step.parts.items()}
        out["total"] = float(step.total_s[0]) * 1e3
        return out

    # -- context-dependent per-layer terms ------------------------------------------------------------
    def _indexer_term(self) -> IndexerTerm:
        heads = self.m.indexer_heads  # replicated on every GPU under any layout (ops.attention_ops)
        name = f"fp8_h{heads}"
        if name in self.t.indexer:
            return self.t.indexer[name]
        # a head count never timed: the nearest measured one stands in (an extrapolation)
        measured = sorted(self.t.indexer, key=lambda k: abs(int(k.split("_h")[-1]) - heads))
        return self.t.indexer[measured[0]]

    def indexer(self, ctx_sum, requests: int, queries: int = 1):
        """One layer's lightning indexer over every context token of the rank's requests (the
        measured kernel: launch + key bytes / bandwidth + the per-request top-k select). With
        ``queries`` positions per request (a speculative verify) the keys are read once per request
        (DeepGEMM's paged MQA logits take ``next_n`` queries per sequence) and the top-k select runs
        per query row: ``requests x queries`` rows in waves of the SMs (a derivation from the fit)."""
        if requests <= 0:
            return np.asarray(ctx_sum, dtype=float) * 0.0
        t = self._indexer_term()
        if queries <= 1:
            return t.time(requests, np.asarray(ctx_sum, dtype=float))
        ctx = np.asarray(ctx_sum, dtype=float)
        waves = math.ceil(requests * queries / t.sms)
        out = t.launch_s + ctx * 132 / t.bw + t.select_s_per_token * waves * ctx / requests
        return float(out) if np.ndim(out) == 0 else out

    def attention_roofline(self, batch: int, heads: int | None = None, k=None,
                           row_bytes: int | None = None):
        """Roofline time of one layer's sparse MLA attention: rows over HBM or FLOPs over the GEMM
        rate (the rates the attention fit divided by, scaled to this GPU)."""
        m = self.m
        heads = heads or max(1, m.attention_heads // self.d.attn_tp)
        k = m.top_k if k is None else k
        row_bytes = row_bytes or m.kv_row_bytes
        att_bytes = batch * np.asarray(k, dtype=float) * row_bytes
        att_flops = 2 * batch * heads * np.asarray(k, dtype=float) * (m.kv_lora_rank + m.qk_rope_head_dim + m.kv_lora_rank)
        return np.maximum(att_bytes / self.terms.hbm_bw, att_flops / self.terms.bf16_flops)

    def attention(self, batch: int, ctx_sum=None):
        """One layer's sparse attention for ``batch`` requests: a launch plus roofline / efficiency
        (fitted per KV row layout); each request reads min(top-k, its context) rows."""
        if batch == 0:
            return 0.0
        launch, eff = self.t.attention["bf16" if self.m.kv_row_bytes >= 1024 else "fp8"]
        k = self.m.top_k if ctx_sum is None else np.minimum(self.m.top_k, np.asarray(ctx_sum, dtype=float) / batch)
        out = launch + self.attention_roofline(batch, k=k) / eff
        return float(out) if np.ndim(out) == 0 else out

    def decode_attention(self, batch: int, ctx_sum=None, verify: int = 1):
        """One layer's sparse attention in a decode, verify or draft pass over ``batch`` query rows
        (requests x ``verify`` positions). Where SGLang runs FlashAttention-3 (``fa3_decode``) FA3's measured
        per-shape table (``costmodel/fa3_decode.py``); elsewhere this repository's fitted kernel term
        (``attention``)."""
        if not self.fa3_decode or self.m.arch == "dsv4" or batch == 0:
            return self.attention(batch, ctx_sum)
        k = self.m.top_k if ctx_sum is None else np.minimum(self.m.top_k, np.asarray(ctx_sum, dtype=float) / batch)
        heads = max(1, self.m.attention_heads // self.d.attn_tp)
        return FA3_SPARSE_DECODE.time(self.g, batch, heads, k, verify, bf16_flops=datasheet_rates(self.g)[1])

    def _pick_fp8(self, fp8_value: float, value: float) -> float:
        """A calibrated FP8-row (656 B) figure where the model has such rows and one was fitted."""
        return fp8_value if self.m.kv_row_bytes < 1024 and fp8_value > 0 else value

    def a2a_copies_per_token(self, extend: bool) -> float:
        """Rows one token puts on the EP all-to-all. DeepEP's low-latency kernels (a decode pass)
        send a token once per selected expert (their receive buffer is [local experts, ranks x max
        tokens, hidden]; DeepEP ``internode_ll.cu``): top-k rows. Its normal kernels (an extend
        pass) send it once per destination rank (``get_dispatch_layout``'s ``is_token_in_rank``), the
        expected number of ranks that hold at least one of its experts under uniform routing,
        ``ranks x (1 - C(E - E/ranks, k) / C(E, k))`` (5.3 for top-8 of 256 experts over 8 ranks),
        the bytes DeepEP's README bandwidths count. Without DeepEP: min(top-k, ranks), as before."""
        k, e, r = self.m.experts_per_token, self.m.experts, self.d.tp
        if self.d.a2a_backend != MoeA2ABackend.DEEPEP:
            return float(min(k, r))
        if not extend:
            return float(k)
        local = e / r
        miss = math.prod((e - local - i) / (e - i) for i in range(k)) if e - local >= k else 0.0
        return r * (1.0 - miss)

    def a2a_rank_tokens(self, batch: float, even: float, extend: bool) -> float:
        """Tokens of the busiest rank of the EP all-to-all. Each rank dispatches its own tokens and takes
        their results back (DeepEP's normal and low-latency kernels alike: ``Buffer.dispatch`` sends the
        caller's ``x``; the same with the all-to-all of other backends), so a rank sends its tokens x
        copies and receives, from every rank, the copies routed to its experts. With the instance's
        tokens spread evenly both are tokens / ranks x copies, what the figures quote (DeepEP's
        benchmark: every rank dispatches the same 4,096 tokens). An extend pass under DP attention may
        hold them on a few ranks (one request's chunk on one rank, the others idle or decoding): the
        largest rank's tokens then leave over its own links, at the same per-GPU figure. Decode passes
        pad every rank to the same graph batch (balanced). ``even``: a rank's share of the instance's
        tokens as each caller counts it; ``batch``: the largest scheduler's tokens."""
        if not extend or self.d.attention != Attention.DP:
            return even
        return max(even, batch / max(self.d.attn_tp, 1))

    def comm_layer(self, batch: float, instance_tokens: float, padded: int | None = None, *,
                   extend: bool | None = None, dense: bool = False) -> float:
        """One layer's collectives on the instance's GPUs (seconds). Under DP attention the MLP side
        gathers every rank's tokens and scatters the result back (SGLang ``layers/dp_attention.py``
        ``DpPaddingMode``): in a decode pass (CUDA graph) each rank's batch is padded to the graph
        size, the same on every rank (MAX_LEN: ``all_gather_into_tensor`` of dp x padded rows, the MLP
        skips its all-reduce and ``dp_reduce_scatter_tensor`` returns each rank's rows); in a pass with
        an extend batch on any rank ``get_dp_padding_mode`` returns SUM_LEN, where
        ``_dp_gather_via_all_reduce`` zero-fills a buffer of the instance's tokens, copies the rank's
        rows in and all-reduces it, and the MLP all-reduces its output before ``dp_scatter`` takes the
        rank's rows (``communicator.py`` ``_scatter_hidden_states``: reduce-scatter only for MAX_LEN):
        two all-reduces of the instance's tokens. Under TP attention the all-reduces run on the padded
        batch of the one scheduler. ``extend`` (default: no ``padded`` batch) picks SUM_LEN and DeepEP's
        normal kernels over its low-latency ones. ``dense``: a dense-MLP layer, whose MLP under DP
        attention is TP-sharded and gathered like the above even with an a2a backend
        (``LayerScatterModes._compute_mlp_mode``: FULL unless ``--moe-dense-tp-size 1``)."""
        ic, d, hidden = self.g.interconnect, self.d, self.m.hidden_size
        msg = instance_tokens * hidden * ACT_BYTES
        if padded is not None:  # every scheduler of the instance contributes its padded batch
            msg = d.ranks_per_instance * padded * hidden * ACT_BYTES
        t = 0.0
        coll = self._collective
        if d.attention == Attention.TP:
            t += coll(Collective.ALL_REDUCE, d.tp, msg)  # after o_proj (row-parallel)
        elif d.attn_tp > 1:
            t += coll(Collective.ALL_REDUCE, d.attn_tp, batch * hidden * ACT_BYTES)
        is_extend = padded is None if extend is None else extend
        if d.moe == MoeLayout.EP and not dense and self._internode_ep:
            t += self._deepep_layer(batch, instance_tokens, extend=is_extend)
        elif d.moe == MoeLayout.EP and not dense:
            # one rank's send buffer: its tokens, each sent as many times as the a2a kernel sends it
            rank_tokens = self.a2a_rank_tokens(batch, instance_tokens / d.tp, is_extend)
            copies = rank_tokens * self.a2a_copies_per_token(is_extend)
            rows = (copies * dispatch_row_bytes(hidden), copies * hidden * ACT_BYTES)
            if d.a2a_backend == MoeA2ABackend.DEEPEP:  # DeepEP's figures count every row a rank receives
                t += sum(ic.received_time_s(Collective.ALL_TO_ALL, d.tp, b) for b in rows)
            else:
                t += sum(ic.time_s(Collective.ALL_TO_ALL, d.tp, b) for b in rows)
        elif d.attention == Attention.DP and d.dp > 1 and is_extend:
            t += 2 * coll(Collective.ALL_REDUCE, d.tp, msg)  # SUM_LEN: gather and MLP output, each an all-reduce
        elif d.attention == Attention.DP and d.dp > 1:
            t += coll(Collective.ALL_GATHER, d.tp, msg)  # MAX_LEN: every rank's padded rows into the MLP
            t += coll(Collective.REDUCE_SCATTER, d.tp, msg)  # MLP partial sums back to their ranks
        else:
            t += coll(Collective.ALL_REDUCE, d.tp, msg)  # after the row-parallel MLP
        return t

    @property
    def _internode_ep(self) -> bool:
        """The EP group spans nodes of the cluster: DeepEP's internode kernels carry the tokens."""
        return self.cluster is not None and self.d.tp > self.cluster.gpus_per_node

    def _collective(self, c: Collective, n: int, nbytes: float) -> float:
        """A collective over ``n`` GPUs: the GPU's interconnect inside a node; across nodes (a cluster
        with ``cross_node_tp``) hierarchically, inside each node then a ring over the nodes' NICs."""
        ic, cl = self.g.interconnect, self.cluster
        if cl is None or n <= cl.gpus_per_node:
            return ic.time_s(c, n, nbytes)
        nodes = -(-n // cl.gpus_per_node)
        return ic.time_s(c, cl.gpus_per_node, nbytes) + nic_ring_time_s(c, nodes, nbytes, cl.nic_bw, cl.nic_latency_us)

    def _deepep_layer(self, batch: float, instance_tokens: float, *, extend: bool) -> float:
        """One layer's dispatch and combine across nodes (DeepEP; ``collectives.deepep_time_s``): the
        busiest rank's tokens (``a2a_rank_tokens``) x top-k rows (FP8 dispatch, BF16 combine) with the
        low-latency kernels in decode passes; with the normal kernels in prefill passes, a token goes once
        to each remote node its experts live on (``expected_remote_nodes``), then over NVLink."""
        cl, d, m = self.cluster, self.d, self.m
        ep, hidden, k = d.tp, m.hidden_size, m.experts_per_token
        per_rank = float(self.a2a_rank_tokens(batch, float(instance_tokens) / max(d.ranks_per_instance, 1), extend))
        if per_rank <= 0:
            return 0.0
        if extend:
            copies = per_rank * expected_remote_nodes(-(-ep // cl.gpus_per_node), k)
            mode = DeepEPMode.NORMAL
        else:
            copies = per_rank * k
            mode = DeepEPMode.LOW_LATENCY
        kw = {"nic_bw": cl.nic_bw, "floor_s": cl.nic_rtt_s}
        return (deepep_time_s("dispatch", mode, ep, copies * dispatch_row_bytes(hidden), **kw)
                + deepep_time_s("combine", mode, ep, copies * hidden * ACT_BYTES, **kw))

    # -- DeepSeek-V4's attention preparation on parallel streams --------------------------------------
    def dsv4_stream_overlap(self, shape: PassShape, work: RankWork):
        """Seconds per step the parallel streams hide of a DeepSeek-V4 decode pass's attention
        preparation (SGLang ``models/deepseek_v4.py`` ``MQALayer._forward_prepare_multi_stream``, on by
        default: ``SGLANG_OPT_USE_MULTI_STREAM_OVERLAP``; LMSYS blog "Hierarchical Multi-Stream
        Overlap"). Inside the CUDA graph, when the layer's tokens are at most ``_multi_stream_bs_limit``
        (64, 128 on Blackwell: ``is_blackwell_supported()``, here the GPUs with FP4 tensor cores), the
        main stream runs q_a (recording ``q_lora_ready``) then q_b; the KV projection and its store run on
        a second stream, the attention compressor on a third, the C4 indexer on a fourth, which splits
        again (``C4IndexerBackend._forward_prepare_multi_stream``): its compressor, its q_b after
        ``q_lora_ready``, its weights projection, then the scoring and top-k. The preparation then takes
        its longest stream instead of the sum; attention waits for all of them. Extend passes (no graph)
        and larger batches run serially."""
        m = self.m
        if m.arch != "dsv4" or shape.extend or work.chunks or work.decode <= 0:
            return 0.0
        rows = shape.padded or work.decode * shape.verify
        if rows > (128 if self.g.fp4_flops > 0 else 64):
            return 0.0
        key = ("dsv4-streams", rows)
        if key not in self._fixed_cache:
            per_kind = {}
            for kind in m.kind_counts:
                t = {o.name: self.op_time(o) for o in dsv4_ops.layer_ops(m, rows, self.layout, kind)}
                g = t.get
                main = g("dsv4_q_a", 0.0) + g("q_a_norm", 0.0) + g("dsv4_q_b", 0.0) + g("q_norm_rope", 0.0)
                kv = g("dsv4_kv_proj", 0.0) + g("kv_norm_rope_store", 0.0)
                comp = g("dsv4_compressor", 0.0)
                idx_q = g("dsv4_q_a", 0.0) + g("q_a_norm", 0.0) + g("dsv4_indexer_q_b", 0.0) + g("indexer_q_rope_quant", 0.0)
                idx_pre = max(g("dsv4_indexer_compressor", 0.0), idx_q, g("dsv4_indexer_weights_proj", 0.0))
                idx_ops = sum(g(n, 0.0) for n in (*dsv4_ops.INDEXER_OPS, "indexer_q_rope_quant"))
                per_kind[kind] = (main, kv, comp, idx_pre, idx_ops)
            self._fixed_cache[key] = per_kind
        hidden = 0.0
        for kind, (main, kv, comp, idx_pre, idx_ops) in self._fixed_cache[key].items():
            scoring = self.c4_indexer(work.ctx_sum, work.decode, shape.verify) if kind == "c4" else 0.0
            serial = main + kv + comp + (idx_ops + scoring if kind == "c4" else 0.0)
            longest = np.maximum(max(main, kv, comp), idx_pre + scoring) if kind == "c4" else max(main, kv, comp)
            hidden = hidden + m.kind_counts[kind] * (serial - longest)
        return hidden

    # -- HiSparse copies ---------------------------------------------------------------------------
    def swap_in_layer(self, missed_rows, batch: int = 0):
        """One layer's swap-in launch: a fixed cost, bookkeeping per request, and the missed rows
        over the host link."""
        copy = np.asarray(missed_rows, dtype=float) * self.m.kv_row_bytes / self.g.swap_bw(self.m.kv_row_bytes)
        launch = self._pick_fp8(self.p.swap_in_launch_fp8_us, self.p.swap_in_launch_us)
        per_request = self._pick_fp8(self.p.swap_in_per_request_fp8_us, self.p.swap_in_per_request_us)
        return (launch + self.swap_in_extra_us + batch * per_request) * 1e-6 + copy

    def swap_in(self, missed_rows, batch: int = 0):
        """One launch per HiSparse layer (every DSA layer; DeepSeek-V4's C4 layers) for the rank's
        batch, plus the missed rows over the host link."""
        n = self.m.hisparse_layers
        per_layer = self.swap_in_layer(np.asarray(missed_rows, dtype=float) / n, batch)
        return per_layer * n * (1 - self.p.swap_in_overlap)

    def layer_times(self, shape: PassShape, work: RankWork) -> LayerTimes:
        """One decode layer's main-stream seconds before and from its attention, and one layer's
        swap-in kernel, for the IndexShare prefetch timeline (an average MoE layer; the rank's
        attention-side ops at its padded graph batch, the MLP at the instance's tokens)."""
        m, lay = self.m, self.layout
        rows = shape.padded or work.decode
        key = ("layer", rows, float(shape.tokens), shape.biggest)
        if key not in self._fixed_cache:
            ops = attention_ops(m, rows, 0.0, lay, m.kv_row_bytes, q_concat=self.decode_q_concat)
            cut = next(i for i, o in enumerate(ops) if o.kind == "attention")
            pre = sum(self.op_time(o) for o in ops[:cut] if o.name not in INDEXER_OPS)
            after = sum(self.op_time(o) for o in ops[cut + 1:])
            mlp = sum(self.op_time(o) for o in moe_ops(m, self._mlp_batch(shape.tokens), lay)) if m.moe_layers else 0.0
            comm = self.comm_layer(shape.biggest, shape.tokens, shape.padded or None) if shape.tokens > 0 else 0.0
            self._fixed_cache[key] = (pre, after + mlp + comm)
        pre, rest = self._fixed_cache[key]
        post = self.decode_attention(work.decode, work.ctx_sum) + rest
        swap = self.swap_in_layer(np.asarray(work.missed_rows, dtype=float) / m.layers, work.decode)
        return LayerTimes(pre, post, swap)

    def prefetch_hidden(self, shape: PassShape, work: RankWork):
        """Seconds of the rank's swap-in per step the IndexShare prefetch hides (0 when it is off)."""
        if not self.prefetch or work.missed_rows is None or work.chunks or work.decode <= 0:
            return 0.0
        return hidden_swap(self.m.anchor_of, self.layer_times(shape, work)) * (1 - self.p.swap_in_overlap)

    # -- a prompt chunk's context terms ----------------------------------------------------------
    def prefill_indexer(self, tokens: int, prior_ctx: int) -> float:
        """The indexer layers' scoring of a prompt chunk (IndexShare: the anchors only) and the top-k over
        the scores it materialises.

        Scoring: each query against every earlier key (quadratic), priced from DeepGEMM's ``fp8_mqa_logits``
        timed on the H200 at these shapes (``costmodel/prompt_chunk.py``: 0.65-1.05 PFLOP/s, the logits write
        and the launch inside; DeepSeek-V4's paged scoring of compressed keys, not measured, at the FP8 GEMM
        term with the keys read and the logits written). SGLang
        0.5.14 (``layers/attention/dsa/dsa_indexer.py`` ``Indexer._get_topk_ragged``) calls
        ``deep_gemm.fp8_mqa_logits(q, (k, k_scale), weights, ks, ke, clean_logits=False)``: an fp32
        [query tokens, batch keys] matrix (``_MQA_LOGITS_BYTES_PER_ELEM = 4``; split into row blocks only past
        a memory budget, ``_should_chunk_mqa_logits``, which moves no byte). DeepGEMM's SM90 kernel
        (``sm90_fp8_mqa_logits.cuh`` in sgl-deep-gemm 0.1.3, SGLang's pin; 2 queries per block at 64 heads)
        computes and stores, per query block, only the key blocks of 256 spanning its queries' [ks, ke) -- the
        causal range, not the whole row -- and with ``clean_logits=False`` no pass writes -inf over the rest
        (``smxx_clean_logits`` is not run; the host allocates with ``torch::empty``). Written: 4 B per causal
        pair, inside the GEMM kernel, so it joins the GEMM's bytes (at 4,096 FLOPs per byte written the
        kernel stays compute-bound and the write adds little). DeepSeek-V4 (``dsv4/indexer.py``) scores its
        C4 layers' compressed keys, one per 4 tokens, with DeepGEMM's paged kernel, fp32 scores alike.

        Top-k: ``metadata.topk_transform`` (default ``--dsa-topk-backend sgl-kernel``, ``SGLANG_DSA_FUSE_TOPK``
        on) runs ``fast_topk_transform_ragged_fused``, one block per query over its [ks, ks + position + 1)
        scores: a row of at most top-k keys reads none, a longer one is read twice (``ops.INDEXER_TOPK_PASSES``;
        the threshold bin's candidates, at most 16,384 a row, are read again and not counted). A separate,
        memory-bound kernel: ``ops.prefill_topk_read_op`` at the elementwise term's bandwidth (measured on the
        H200, scaled elsewhere; not measured for this kernel: its second pass may hit L2 for rows up to ~100K keys,
        its scalar loads may run below the rate). No fitted constant. The decode indexer's own logits ([requests, context],
        paged) are inside its fitted term (``indexer_all``), not here; IndexShare's shared layers reuse an
        anchor's top-k and score nothing (``indexer_layers``)."""
        m = self.m
        if m.arch == "dsv4":  # the paged scoring of compressed keys: not measured, the FP8 GEMM term
            per_key = self.indexer_tokens_per_key
            ctx_pairs = tokens * (prior_ctx + tokens / 2)  # query x earlier-key pairs of the chunk
            idx_flops = 2.0 * ctx_pairs * m.indexer_heads * m.indexer_head_dim / per_key
            idx_bytes = ((prior_ctx + tokens) * m.indexer_row_bytes + ctx_pairs * INDEXER_LOGITS_BYTES) / per_key
            score = self.t.rates[("gemm", "fp8")].time(idx_bytes, idx_flops)
        else:  # heads replicated on every GPU under any layout (ops.attention_ops)
            score = MQA_LOGITS.time(self.g, tokens, prior_ctx, m.indexer_heads, m.indexer_head_dim)
        return m.indexer_layers * (score + self.prefill_topk_read(tokens, prior_ctx))

    def prefill_topk_read(self, tokens: int, prior_ctx: int) -> float:
        """Seconds of one indexer layer's top-k reading a prompt chunk's materialised logits
        (``prefill_indexer``; ``ops.prefill_topk_read_op``)."""
        return self.op_time(prefill_topk_read_op(tokens, prior_ctx, self.m.top_k, self.indexer_tokens_per_key))

    @property
    def indexer_tokens_per_key(self) -> int:
        """Tokens per key the indexer scores: DeepSeek-V4's C4 layers score a compressed key per 4 tokens
        (``dsv4/indexer.py``), the DSA models every token."""
        return 4 if self.m.arch == "dsv4" else 1

    def flashmla_heads(self, heads: int) -> int:
        """Query heads FlashMLA's sparse kernel computes for ``heads`` real ones: SGLang pads them to a
        multiple of 64 on Hopper, 128 on Blackwell (``nsa_backend._forward_flashmla_sparse``: "FlashMLA
        sparse kernel requires num_heads to be a multiple of 64 (Hopper) or 128 (Blackwell) ... Pad q to
        required size"; the LMSYS DeepSeek-V4 blog, "FlashMLA head padding under high TP"). Blackwell:
        here the GPUs with FP4 tensor cores."""
        required = 128 if self.g.fp4_flops > 0 else 64
        return -(-heads // required) * required if heads % required else heads

    def prefill_q_pad(self, tokens: int) -> float:
        """Seconds of every layer's q padding before FlashMLA's sparse prefill of a ``tokens``-token chunk
        (``ops.flashmla_q_pad_ops``): under attention TP the rank's heads are padded to the kernel's multiple
        (``flashmla_heads``: GLM at TP8 on Hopper, 8 -> 64). Only the BF16-KV prefill backend,
        ``flashmla_sparse`` (``server_args._set_default_nsa_backends``), pads; DeepSeek-V4's path is its own. Any
        SGLang version that runs the kernel at 8 heads must pad: FlashMLA asserts ``h_q % B_H == 0``
        (``csrc/sm90/prefill/sparse/phase1.cuh``). A chunk whose sequences all fit in top-k runs dense MHA instead
        (``MHA_ONE_SHOT``); like its attention (``prefill_attention``) it is priced as the FlashMLA path."""
        m = self.m
        if m.arch == "dsv4" or m.kv_row_bytes < 1024 or tokens <= 0:
            return 0.0
        heads = max(1, m.attention_heads // self.layout.attention_tp)
        ops = flashmla_q_pad_ops(m, tokens, heads, self.flashmla_heads(heads))
        return m.layers * sum(self.op_time(o) for o in ops)

    def prefill_attention(self, tokens: int, prior_ctx: int, hisparse: bool = False) -> float:
        """Every layer's sparse attention over a prompt chunk, FlashMLA's sparse prefill as timed on the H200
        per chunk size and context (``costmodel/prompt_chunk.py``), on the heads FlashMLA's sparse prefill computes
        (``flashmla_heads``: under attention TP the rank's few heads are padded, 8 -> 64 for GLM at TP8 on
        Hopper; SGLang's bf16-KV prefill backend on Hopper and Blackwell is flashmla_sparse,
        ``server_args._set_default_nsa_backends``). Rows per query: top-k on FlashMLA's sparse path, which
        runs every slot of the [tokens, top-k] index table, the -1 ones of early positions included (SGLang
        passes no ``topk_length``, ``dsa_backend._forward_flashmla_sparse``; the kernel then loops over
        ``topk / 64`` blocks per query, ``csrc/sm90/prefill/sparse/phase1.cuh``); min(top-k, the chunk's mean
        position) where SGLang runs dense MHA instead (``sparse_prefill_runs_dense``)."""
        m = self.m
        heads = self.flashmla_heads(max(1, m.attention_heads // self.layout.attention_tp))
        if m.arch == "dsv4":  # each kind's rows at the chunk's mean position, head_dim for QK and PV
            from ..serving.layer_kinds import LAYER_KINDS

            pos = prior_ctx + tokens / 2
            rows = sum(n * float(LAYER_KINDS[k].attended_rows(pos, m.top_k, m.sliding_window))
                       for k, n in m.kind_counts.items())
            att_flops = 2.0 * tokens * heads * rows * 2 * m.head_dim
            return att_flops / FLASHMLA_SPARSE_PREFILL.flop_rate(self.g, tokens, prior_ctx + tokens, heads)
        dense = sparse_prefill_runs_dense(prior_ctx + tokens, hisparse)
        k = min(m.top_k, prior_ctx + tokens / 2) if dense else m.top_k
        # a row of 2 x kv_lora_rank + rope dims against the measured 576 + 512 (the same for every shipped DSA model)
        dims = 2.0 * (2 * m.kv_lora_rank + m.qk_rope_head_dim) / MLA_ROW_FLOPS
        return m.layers * FLASHMLA_SPARSE_PREFILL.time(self.g, tokens, prior_ctx + tokens, heads, rows=k) * dims

    def kv_copy_time(self, tokens: int) -> float:
        """Copying ``tokens`` tokens' KV (every layer HiSparse serves: DeepSeek-V4's C4 rows) between HBM
        and host memory over the host link."""
        return tokens * self.m.host_kv_bytes_per_token() / self.g.link_bw

    # -- every layer's context terms, by layer kind (serving/layer_kinds.py) -------------------------
    def indexer_all(self, ctx_sum, requests: int, queries: int = 1):
        """The step's lightning-indexer scoring: IndexShare anchors over every token's key (MLA), or
        DeepSeek-V4's C4 layers over a compressed key per 4 tokens (``c4_indexer``); ``queries``
        positions per request under a speculative verify (``indexer``)."""
        if self.m.arch == "dsv4":
            return self.m.indexer_layers * self.c4_indexer(ctx_sum, requests, queries)
        return self.m.indexer_layers * self.indexer(ctx_sum, requests, queries)

    def c4_indexer(self, ctx_sum, requests: int, queries: int = 1):
        """One DeepSeek-V4 C4 layer's indexer: the fitted scoring (launch + every compressed key read
        once, one per 4 tokens) and SGLang's Lightning TopK select over those candidates, per query row
        (``published_kernels.LIGHTNING_TOPK``), in place of the DSA models' fitted exact top-k."""
        if requests <= 0:
            return np.asarray(ctx_sum, dtype=float) * 0.0
        t = self._indexer_term()
        keys = np.asarray(ctx_sum, dtype=float) / self.indexer_tokens_per_key
        out = t.launch_s + keys * 132 / t.bw + LIGHTNING_TOPK.time(requests * queries, keys / requests, t.sms)
        return float(out) if np.ndim(out) == 0 else out

    def attention_all(self, batch: int, ctx_sum=None, verify: int = 1):
        """The step's attention over every layer: MLA's top-k rows (``decode_attention``: ``batch`` query rows,
        ``verify`` positions per request), or per DeepSeek-V4 kind the window and the compressed rows it
        attends (``attention_kind``)."""
        if self.m.arch != "dsv4":
            return self.m.layers * self.decode_attention(batch, ctx_sum, verify)
        total = 0.0
        for kind, n in self.m.kind_counts.items():
            total = total + n * self.attention_kind(kind, batch, ctx_sum)
        return total

    def attention_kind(self, kind: str, batch: int, ctx_sum=None):
        """One DeepSeek-V4 layer's attention for ``batch`` requests: the fitted FP8 sparse-attention
        launch plus the roofline over the rows the kind attends (584 B each; one K=V head of head_dim
        for QK and PV) divided by the fitted efficiency."""
        from ..serving.layer_kinds import LAYER_KINDS

        if batch == 0:
            return 0.0
        m = self.m
        launch, eff = self.t.attention["bf16" if m.kv_row_bytes >= 1024 else "fp8"]
        ctx = np.asarray(m.context_length if ctx_sum is None else np.asarray(ctx_sum, dtype=float) / batch, dtype=float)
        rows = LAYER_KINDS[kind].attended_rows(ctx, m.top_k, m.sliding_window)
        heads = max(1, m.attention_heads // self.d.attn_tp)
        roof = np.maximum(batch * rows * m.kv_row_bytes / self.terms.hbm_bw,
                          2 * batch * heads * rows * 2 * m.head_dim / self.terms.bf16_flops)
        out = launch + roof / eff
        return float(out) if np.ndim(out) == 0 else out
