"""The cost model: time of one decode step and of one prefill chunk on one attention rank.

All GPUs of an instance run each forward pass in lockstep, so a rank's step time is one GPU's time
for its share of every op. A decode step is the sum of its kernels, one after another, each priced by
the term measured for its kind and dtype on the H200 (``step_costs.py``; scaled by datasheet ratios
on other GPUs), op by op as ``simulator/calibration/layer_work.py`` lists them from the model's
shapes and the deployment's layout (``step_costs.layout_for``):

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
- communication (``comm.py``): DP attention gathers the instance's tokens before the MLP and
  reduce-scatters after it; TP attention all-reduces after attention and after the MLP; EP
  dispatches and combines tokens all-to-all;
- HiSparse: one swap-in launch per layer (a fixed cost, bookkeeping per request, missed rows over
  the host link) and the newest token's backup to host, each less the share that overlaps compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..calibration.layer_work import (
    GROUPED_KINDS,
    Op,
    attention_ops,
    dense_mlp_ops,
    moe_ops,
    step_head_ops,
)
from ..calibration.step_terms import IndexerTerm, StepTerms
from .comm import Collective
from .specs import Attention, CostParams, DeploymentSpec, GpuSpec, ModelSpec, MoeLayout
from .step_costs import GpuTerms, layout_for, terms_for

ACT_BYTES = 2  # bf16 hidden states on the wire (SGLang communicates activations in the model dtype)


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


_REPORT_GROUPS = {
    **{n: "routed experts" for n in ("routed_gate_up", "routed_down", "routed_silu_mul_quant", "moe_combine",
                                     "moe_align_sort")},
    **{n: "attention-side GEMMs" for n in ("qkv_a_proj", "q_b_proj", "o_proj", "indexer_wq_b", "indexer_wk",
                                           "indexer_weights_proj")},
    "w_kc_absorbed": "absorbed bmm", "w_vc_absorbed": "absorbed bmm",
    **{n: "shared expert, router, dense MLP" for n in ("shared_gate_up", "shared_down", "shared_silu_mul",
                                                       "router_gate", "router_topk", "dense_gate_up", "dense_down",
                                                       "silu_mul_quant")},
    "indexer_score_topk": "lightning indexer", "sparse_attention": "sparse attention",
    "lm_head": "lm_head, sampler", "sampler": "lm_head, sampler", "final_norm": "lm_head, sampler",
}


@dataclass(frozen=True)
class StepTime:
    """Seconds per decode step (arrays over consecutive steps)."""

    compute_s: np.ndarray
    comm_s: np.ndarray
    swap_s: np.ndarray
    backup_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return self.compute_s + self.comm_s + self.swap_s + self.backup_s


class CostModel:
    def __init__(self, model: ModelSpec, gpu: GpuSpec, dep: DeploymentSpec, params: CostParams,
                 terms: GpuTerms | None = None) -> None:
        self.m, self.g, self.d, self.p = model, gpu, dep, params
        self.terms = terms or terms_for(gpu)
        self.t: StepTerms = self.terms.terms
        self.layout = layout_for(dep, model)
        self._fixed_cache: dict[tuple, float] = {}

    # -- ops --------------------------------------------------------------------------------------
    def op_time(self, op: Op) -> float:
        """Seconds of one op (all its launches) from its fitted term; FP8 grouped and batched GEMMs,
        whose fits never met their compute roof at decode shapes, are also bounded by the FP8 GEMM
        rate (it matters only at prefill token counts: an extrapolation)."""
        t = self.t.op_time(op)
        if op.kind in (*GROUPED_KINDS, "batched_gemm"):
            rate = self.t.rates.get(("gemm", op.dtype))
            if rate is not None:
                t = max(t, (rate.launch_s + op.flops / rate.flops_rate) * op.count)
        return t

    def experts_touched(self, instance_tokens: float) -> float:
        """Share of routed experts at least one of the step's tokens uses (uniform routing)."""
        miss = 1.0 - self.m.experts_per_token / self.m.experts
        return 1.0 - miss ** max(float(instance_tokens), 0.0)

    def _rank_tokens(self, batch: float, instance_tokens: float) -> float:
        """Tokens one attention rank computes attention for: its own (DP) or the instance's (TP)."""
        return instance_tokens if self.d.attention == Attention.TP else batch

    def _mlp_batch(self, instance_tokens: float) -> float:
        """The per-rank batch whose MLP side sees ``instance_tokens`` (layer_work multiplies by dp)."""
        return max(float(instance_tokens) / self.layout.attention_dp, 1e-9)

    def attention_side_ops(self, padded: int) -> list[tuple[int, Op]]:
        """(repeat, op) of one rank's attention-side kernels other than the indexer and attention,
        at its (padded) batch: these run on each DP rank's own requests."""
        m = self.m
        ops = attention_ops(m, padded, 0.0, self.layout, m.kv_row_bytes)
        return [(m.layers, o) for o in ops if o.kind not in ("indexer", "attention")]

    def mlp_side_ops(self, instance_tokens: float, rows: float | None = None,
                     head_rows: float | None = None) -> list[tuple[int, Op]]:
        """(repeat, op) of the kernels that see the whole instance's tokens: dense MLP layers on
        ``rows`` (every rank's padded batch under CUDA graphs; default the tokens), the MoE layers
        on the real tokens (pad rows are masked out of routing), and the head once per step on
        ``head_rows`` (default ``rows``; a prefill chunk samples only a request's last token)."""
        m, lay = self.m, self.layout
        rows = float(instance_tokens if rows is None else rows)
        head_rows = rows if head_rows is None else float(head_rows)
        out: list[tuple[int, Op]] = []
        if m.dense_layers:
            out += [(m.dense_layers, o) for o in dense_mlp_ops(m, self._mlp_batch(rows), lay)]
        if m.moe_layers:
            out += [(m.moe_layers, o) for o in moe_ops(m, self._mlp_batch(instance_tokens), lay)]
        out += [(1, o) for o in step_head_ops(m, self._mlp_batch(head_rows), lay)]
        return out

    def fixed_ops(self, padded: int, instance_tokens: float) -> list[tuple[int, Op]]:
        """(repeat, op) of a decode step's kernels other than the indexer and attention: attention
        side, dense layers and head at the padded rank batch, MoE layers at the instance's real tokens."""
        return self.attention_side_ops(padded) + self.mlp_side_ops(instance_tokens, padded * self.layout.attention_dp)

    def _ops_time(self, ops: list[tuple[int, Op]]) -> float:
        return sum(n * self.op_time(o) for n, o in ops)

    def fixed_time(self, padded: int, instance_tokens: float) -> float:
        return self.attention_fixed(padded) + self.mlp_time(instance_tokens, padded * self.layout.attention_dp)

    def attention_fixed(self, padded: int) -> float:
        """Seconds of a rank's attention-side GEMMs and elementwise ops at its (padded) batch."""
        key = ("att", padded)
        if key not in self._fixed_cache:
            self._fixed_cache[key] = self._ops_time(self.attention_side_ops(padded))
        return self._fixed_cache[key]

    def mlp_time(self, instance_tokens: float, rows: float | None = None, head_rows: float | None = None) -> float:
        """Seconds of the instance-wide kernels (dense MLPs, MoE, head) for these tokens."""
        key = ("mlp", float(instance_tokens), rows, head_rows)
        if key not in self._fixed_cache:
            self._fixed_cache[key] = self._ops_time(self.mlp_side_ops(instance_tokens, rows, head_rows))
        return self._fixed_cache[key]

    def attention_side(self, batch: int, ctx_sum, padded: int | None = None):
        """One rank's attention-side time per step: its GEMMs and elementwise ops at ``padded`` rows
        (CUDA graph; default the real batch), the indexer and sparse attention on its requests."""
        if batch <= 0:
            return np.asarray(ctx_sum, dtype=float) * 0.0
        ctx = np.asarray(ctx_sum, dtype=float)
        per_layer = self.indexer(ctx, batch) + self.attention(batch, ctx)
        return self.attention_fixed(padded or batch) + self.m.layers * per_layer

    def breakdown(self, batch: int, instance_tokens: float, ctx_sum: float) -> dict[str, float]:
        """Seconds per op name of one decode step (for reports): compute only."""
        padded = cuda_graph_batch(batch)
        out: dict[str, float] = {}
        for n, o in self.fixed_ops(padded, instance_tokens):
            out[o.name] = out.get(o.name, 0.0) + n * self.op_time(o)
        rank = int(self._rank_tokens(batch, instance_tokens))
        out["indexer_score_topk"] = self.m.layers * float(self.indexer(ctx_sum, rank))
        out["sparse_attention"] = self.m.layers * float(self.attention(rank, ctx_sum))
        return out

    def step_report(self, batch: int, ctx_per_request: float) -> dict[str, float]:
        """Milliseconds of one decode step with ``batch`` requests on every scheduler of the
        instance, each at ``ctx_per_request`` tokens, by term group (and the total)."""
        inst = batch * self.layout.attention_dp
        out: dict[str, float] = {}
        for name, sec in self.breakdown(batch, inst, batch * ctx_per_request).items():
            group = _REPORT_GROUPS.get(name, "norms, rope, quantisation")
            out[group] = out.get(group, 0.0) + sec * 1e3
        out["collectives"] = self.comm(batch, inst) * 1e3
        out["total"] = sum(out.values())
        return out

    # -- context-dependent per-layer terms ------------------------------------------------------------
    def _indexer_term(self) -> IndexerTerm:
        heads = max(1, self.m.indexer_heads // self.layout.attention_tp)
        name = f"fp8_h{heads}"
        if name in self.t.indexer:
            return self.t.indexer[name]
        # heads split under TP attention: the key reads (the bandwidth term) do not shrink with
        # heads; the nearest measured head count stands in (an extrapolation)
        measured = sorted(self.t.indexer, key=lambda k: abs(int(k.split("_h")[-1]) - heads))
        return self.t.indexer[measured[0]]

    def indexer(self, ctx_sum, requests: int):
        """One layer's lightning indexer over every context token of the rank's requests (the
        measured kernel: launch + key bytes / bandwidth + the per-request top-k select)."""
        if requests <= 0:
            return np.asarray(ctx_sum, dtype=float) * 0.0
        return self._indexer_term().time(requests, np.asarray(ctx_sum, dtype=float))

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

    def _pick_fp8(self, fp8_value: float, value: float) -> float:
        """A calibrated FP8-row (656 B) figure where the model has such rows and one was fitted."""
        return fp8_value if self.m.kv_row_bytes < 1024 and fp8_value > 0 else value

    def comm_layer(self, batch: float, instance_tokens: float, padded: int | None = None) -> float:
        """One layer's collectives on the instance's GPUs (seconds). Under DP attention every rank
        gathers ``padded`` rows (its batch padded to the CUDA-graph size, the same on every rank:
        SGLang's MAX_LEN mode, ``layers/dp_attention.py``), so the message is dp x padded rows; under
        TP attention the all-reduces run on the padded batch of the one scheduler."""
        ic, d, hidden = self.g.interconnect, self.d, self.m.hidden_size
        msg = instance_tokens * hidden * ACT_BYTES
        if padded is not None:  # every scheduler of the instance contributes its padded batch
            msg = d.ranks_per_instance * padded * hidden * ACT_BYTES
        t = 0.0
        if d.attention == Attention.TP:
            t += ic.time_s(Collective.ALL_REDUCE, d.tp, msg)  # after o_proj (row-parallel)
        elif d.attn_tp > 1:
            t += ic.time_s(Collective.ALL_REDUCE, d.attn_tp, batch * hidden * ACT_BYTES)
        if d.moe == MoeLayout.EP:
            # one rank's send buffer: its tokens, once per destination rank holding one of its experts
            copies = instance_tokens / d.tp * min(self.m.experts_per_token, d.tp)
            t += ic.time_s(Collective.ALL_TO_ALL, d.tp, copies * dispatch_row_bytes(hidden))
            t += ic.time_s(Collective.ALL_TO_ALL, d.tp, copies * hidden * ACT_BYTES)
        elif d.attention == Attention.DP and d.dp > 1:
            t += ic.time_s(Collective.ALL_GATHER, d.tp, msg)  # every rank's tokens into the MLP
            t += ic.time_s(Collective.REDUCE_SCATTER, d.tp, msg)  # MLP partial sums back to their ranks
        else:
            t += ic.time_s(Collective.ALL_REDUCE, d.tp, msg)  # after the row-parallel MLP
        return t

    # -- a decode step ----------------------------------------------------------------------------
    def decode_compute(self, batch: int, instance_tokens: float, ctx_sum):
        """Compute time of decode steps; ``ctx_sum`` (the rank's context tokens) may be an array."""
        if batch <= 0:
            return np.asarray(ctx_sum, dtype=float) * 0.0
        rank = int(self._rank_tokens(batch, instance_tokens))
        padded = cuda_graph_batch(rank)
        return (self.attention_side(rank, ctx_sum, padded)
                + self.mlp_time(instance_tokens, padded * self.layout.attention_dp))

    def comm(self, batch: int, instance_tokens: float) -> float:
        """A decode step's collectives (CUDA-graph replay: the batch padded to a captured size)."""
        if batch <= 0:
            return 0.0
        return self.m.layers * self.comm_layer(batch, instance_tokens, cuda_graph_batch(batch))

    def swap_in_layer(self, missed_rows, batch: int = 0):
        """One layer's swap-in launch: a fixed cost, bookkeeping per request, and the missed rows
        over the host link."""
        copy = np.asarray(missed_rows, dtype=float) * self.m.kv_row_bytes / self.g.swap_bw(self.m.kv_row_bytes)
        launch = self._pick_fp8(self.p.swap_in_launch_fp8_us, self.p.swap_in_launch_us)
        per_request = self._pick_fp8(self.p.swap_in_per_request_fp8_us, self.p.swap_in_per_request_us)
        return (launch + batch * per_request) * 1e-6 + copy

    def swap_in(self, missed_rows, batch: int = 0):
        """One launch per layer for the rank's batch, plus the missed rows over the host link."""
        per_layer = self.swap_in_layer(np.asarray(missed_rows, dtype=float) / self.m.layers, batch)
        return per_layer * self.m.layers * (1 - self.p.swap_in_overlap)

    def backup(self, batch: int) -> float:
        """A decode step's copy of each request's previous token to host (``backup_overlap`` hidden)."""
        return self.kv_copy_time(batch) * (1 - self.p.backup_overlap)

    def decode_steps(self, batch: int, instance_tokens: float, ctx_sum, missed_rows=None) -> StepTime:
        """Time of decode steps (arrays in, arrays out); ``missed_rows`` None: baseline, no host tier."""
        compute = np.asarray(self.decode_compute(batch, instance_tokens, ctx_sum), dtype=float)
        zeros = np.zeros_like(compute)
        comm = np.full_like(compute, self.comm(batch, instance_tokens))
        if missed_rows is None or batch == 0:
            return StepTime(compute, comm, zeros, zeros)
        swap = np.broadcast_to(np.asarray(self.swap_in(missed_rows, batch), dtype=float), compute.shape)
        return StepTime(compute, comm, swap, np.full_like(compute, self.backup(batch)))

    # -- a prefill chunk --------------------------------------------------------------------------
    def prefill_attention_side(self, tokens: int, prior_ctx: int) -> float:
        """One rank's attention side of a prompt chunk, from the same ops at the chunk's token count:
        every GEMM and elementwise op by its measured term (compute-bound here: the fitted FP8/BF16
        rates; grouped and batched GEMMs, timed only at decode shapes, bounded by the FP8 GEMM rate:
        an extrapolation); the indexer as an FP8 GEMM of each query against every earlier key
        (quadratic; the decode indexer kernel does not apply: extrapolated at the FP8 GEMM rate);
        sparse attention over min(top-k, position) rows per query at FlashMLA's prefill rate
        (``prefill_attention_efficiency``)."""
        return self.prefill_batch_attention_side([(tokens, prior_ctx)])

    def prefill_batch_attention_side(self, chunks: list[tuple[int, int]]) -> float:
        """One rank's attention side of an extend batch of several prompt chunks ``(tokens,
        prior_ctx)`` (SGLang's PrefillAdder packs requests up to the chunk budget): the GEMMs and
        elementwise ops once at the batch's total tokens, the indexer and attention per chunk."""
        t = self._ops_time(self.attention_side_ops(sum(n for n, _ in chunks)))
        return t + sum(self._prefill_context_terms(n, prior) for n, prior in chunks)

    def _prefill_context_terms(self, tokens: int, prior_ctx: int) -> float:
        m, p, lay = self.m, self.p, self.layout
        t = 0.0
        ctx_pairs = tokens * (prior_ctx + tokens / 2)  # query x earlier-key pairs of the chunk
        fp8 = self.t.rates[("gemm", "fp8")]
        heads_idx = max(1, m.indexer_heads // lay.attention_tp)
        idx_flops = 2.0 * ctx_pairs * heads_idx * m.indexer_head_dim
        idx_bytes = (prior_ctx + tokens) * m.indexer_row_bytes
        t += m.layers * fp8.time(idx_bytes, idx_flops)
        k = min(m.top_k, prior_ctx + tokens / 2)
        heads = max(1, m.attention_heads // lay.attention_tp)
        att_flops = 2.0 * tokens * heads * k * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        return t + m.layers * att_flops / (self.terms.bf16_flops * p.prefill_attention_efficiency)

    def prefill_chunk(self, tokens: int, prior_ctx: int, hisparse: bool, instance_tokens: float | None = None) -> float:
        """One chunk of a prompt on its rank when every rank of the instance prefills alike (the
        MLP over ``instance_tokens``), with the collectives; HiSparse also copies the chunk's KV to
        host (``backup_overlap`` of it hidden)."""
        inst = float(tokens if instance_tokens is None else instance_tokens)
        rank_tokens = int(self._rank_tokens(tokens, inst))
        t = self.prefill_attention_side(rank_tokens, prior_ctx) + self.mlp_time(inst, head_rows=self.layout.attention_dp)
        t += self.m.layers * self.comm_layer(tokens, inst)
        if hisparse:
            t += self.prefill_backup(tokens)
        return t

    def kv_copy_time(self, tokens: int) -> float:
        """Copying ``tokens`` tokens' KV (every layer) between HBM and host memory over the host link."""
        return tokens * self.m.kv_bytes_per_token() / self.g.link_bw

    def prefill_backup(self, tokens: int) -> float:
        return self.kv_copy_time(tokens) * (1 - self.p.backup_overlap)
