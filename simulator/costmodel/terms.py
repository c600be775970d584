"""Fitted decode-step cost terms and the time they give an op, a layer, a step (CPU only).

Each kernel kind (``ops.KINDS``) and dtype has a measured term

    t = launch + max(bytes / bandwidth, flops / rate)

fitted by ``fitting.fit_roofline`` to kernels timed at the model's shapes (``hisparse calibrate``);
the lightning indexer has its own (``launch + key bytes / bandwidth + select``); sparse attention
and swap-in keep the terms fitted since issue 8 (``params`` in ``calibration/h200.json``). The
whole group is stored under ``step_terms`` in the calibration JSON.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .ops import DEFAULT_TP_MOE_KERNEL, TP_MOE_KERNELS, TP_MOE_KINDS, Op

# The roofline the attention fit divided by (``fitting.fit_attention``; h200.toml's figures,
# BRIEF 3: measured HBM copy and 8192^3 GEMM on this workplace's H200).
ATTENTION_ROOFLINE = {"hbm_bw": 4.266e12, "bf16_flops": 7.69e14}

# GEMM kinds SGLang runs through cuBLAS in BF16 (the absorbed MLA bmm of every checkpoint), priced by the
# measured cuBLAS BF16 term of another kind when no BF16 term of their own was timed (``StepTerms.with_bf16``)
BF16_TWINS = {"batched_gemm": "gemm"}


@dataclass(frozen=True)
class Rate:
    """launch (s) + max(bytes / bw, flops / flops_rate); a rate of inf means 'never the limit'.
    ``weights_only``: the bytes are the op's weight bytes, not weights + activations (the TP
    fused-MoE slices: fitted so, their time follows the experts touched, not the rows)."""

    launch_s: float
    bw: float
    flops_rate: float = math.inf
    weights_only: bool = False

    def time(self, nbytes: float, flops: float = 0.0) -> float:
        return self.launch_s + max(nbytes / self.bw, flops / self.flops_rate)

    def op_time(self, op: Op) -> float:
        return self.time(op.weight_bytes if self.weights_only else op.bytes, op.flops)

    @classmethod
    def from_json(cls, d: dict) -> Rate:
        return cls(d["launch_us"] * 1e-6, d["gbps"] * 1e9, (d.get("tflops") or math.inf) * 1e12,
                   d.get("bytes") == "weights")


@dataclass(frozen=True)
class IndexerTerm:
    """launch + key bytes / bw + select_s_per_token x (waves of requests x tokens per request):
    scoring streams every key row once; the exact top-k gives each request one block, so its
    time follows the context length, in waves of ``sms`` requests."""

    launch_s: float
    bw: float
    select_s_per_token: float
    sms: int = 132

    def time(self, requests: int, ctx_sum: float) -> float:
        if requests <= 0:
            return 0.0
        waves = math.ceil(requests / self.sms)
        return self.launch_s + ctx_sum * 132 / self.bw + self.select_s_per_token * waves * ctx_sum / requests


@dataclass(frozen=True)
class StepTerms:
    rates: dict[tuple[str, str], Rate]  # (kind, dtype)
    indexer: dict[str, IndexerTerm]  # "fp8_h32", "fp8_h64", ...
    graph_launch_s: float
    attention: dict[str, tuple[float, float]]  # kv dtype -> (launch s, efficiency)
    swap_in: dict[int, tuple[float, float, float]]  # row bytes -> (launch s, per-request s, bytes/s)
    roofline: dict[str, float] = dataclasses.field(default_factory=lambda: dict(ATTENTION_ROOFLINE))
    # which kernel's term prices the TP fused-MoE slices (ops.TP_MOE_KERNELS)
    tp_moe_kernel: str = DEFAULT_TP_MOE_KERNEL

    def __post_init__(self) -> None:
        if self.tp_moe_kernel not in TP_MOE_KERNELS:
            raise ValueError(f"tp_moe_kernel must be one of {', '.join(TP_MOE_KERNELS)}, got {self.tp_moe_kernel!r}")

    @classmethod
    def from_calibration(cls, cal: dict) -> StepTerms:
        """From a calibration JSON (``calibration/h200.json``): ``step_terms`` plus the attention and
        swap-in fits in ``fit``."""
        st = cal.get("step_terms")
        if not st:
            raise KeyError("calibration has no step_terms group: run hisparse calibrate (step terms)")
        rates = {(kind, dt): Rate.from_json(v) for kind, per in st["rates"].items() for dt, v in per.items()}
        idx = {name: IndexerTerm(v["launch_us"] * 1e-6, v["gbps"] * 1e9, v["select_ns_per_token"] * 1e-9)
               for name, v in st["indexer"].items()}
        att = {dt: (v["attention_launch_us"] * 1e-6, v["attention_efficiency"]) for dt, v in cal["fit"]["attention"].items()}
        sw = {int(r): (v["launch_us"] * 1e-6, v["per_request_us"] * 1e-6, v["gbps"] * 1e9)
              for r, v in cal["fit"]["swap_in"]["per_row"].items()}
        return cls(rates, idx, st["graph_launch_us"] * 1e-6, att, sw,
                   tp_moe_kernel=st.get("tp_moe_kernel", DEFAULT_TP_MOE_KERNEL))

    def scaled(self, hbm: float, flops: float, link: float = 1.0, floor: float = 1.0) -> StepTerms:
        """These terms for another GPU from datasheet ratios (its figure / the H200's): every
        bandwidth x ``hbm``, every compute rate and attention's roofline x ``flops``, swap-in
        bandwidth x ``link``, and every fitted per-kernel floor (each kernel kind's launch intercept,
        the graph node, attention's and the indexer's launch) x ``floor``: the H200's SM boost clock
        over this GPU's (``pricing.floor_ratio``; a kernel at zero work runs a fixed number of SM
        cycles). Efficiencies and the indexer's per-token select unchanged. A derivation, not a
        measurement: say so where it is used."""
        rates = {k: dataclasses.replace(r, launch_s=r.launch_s * floor, bw=r.bw * hbm, flops_rate=r.flops_rate * flops)
                 for k, r in self.rates.items()}
        idx = {k: dataclasses.replace(t, launch_s=t.launch_s * floor, bw=t.bw * hbm) for k, t in self.indexer.items()}
        sw = {r: (a, b, bw * link) for r, (a, b, bw) in self.swap_in.items()}
        att = {k: (launch * floor, eff) for k, (launch, eff) in self.attention.items()}
        return dataclasses.replace(self, rates=rates, indexer=idx, swap_in=sw, attention=att,
                                   graph_launch_s=self.graph_launch_s * floor,
                                   roofline={"hbm_bw": self.roofline["hbm_bw"] * hbm,
                                             "bf16_flops": self.roofline["bf16_flops"] * flops})

    def with_fp4(self, flops_ratio: float) -> StepTerms:
        """These terms with an ``fp4`` twin of every FP8 GEMM term a calibration lacks: same launch
        and bandwidth (an FP4 op's bytes are its own), FLOP rate x ``flops_ratio``."""
        extra = {(kind, "fp4"): dataclasses.replace(r, flops_rate=r.flops_rate * flops_ratio)
                 for (kind, dt), r in self.rates.items() if dt == "fp8" and (kind, "fp4") not in self.rates}
        return dataclasses.replace(self, rates={**self.rates, **extra}) if extra else self

    def with_bf16(self) -> StepTerms:
        """These terms with a ``bf16`` twin of the GEMM kinds timed here only in FP8 that SGLang runs
        through cuBLAS in BF16: the absorbed ``w_kc`` / ``w_vc`` batched GEMM (timed by earlier
        calibrations as ``bmm_fp8``) is a ``torch.bmm`` of BF16 weights for every MLA checkpoint on
        NVIDIA GPUs (``ops.ABSORBED_BMM_DTYPE``: ``post_load_weights`` dequantises block-FP8 ``kv_b_proj``;
        ``forward_absorb_prepare`` calls ``bmm_fp8`` only for an FP8 ``w_kc``). Priced by the measured
        cuBLAS BF16 GEMM term (``BF16_TWINS``): a derivation from a kernel of the same library and dtype,
        not a measurement of the batched kernel; a calibration that times it keeps its own."""
        extra = {(kind, "bf16"): self.rates[(twin, "bf16")] for kind, twin in BF16_TWINS.items()
                 if (kind, "bf16") not in self.rates and (twin, "bf16") in self.rates}
        return dataclasses.replace(self, rates={**self.rates, **extra}) if extra else self

    def op_time(self, op: Op, indexer_heads: int | None = None, indexer_q: str = "fp8") -> float:
        """Seconds of one op (all its launches); the indexer's heads come from the op (``n``)
        unless given."""
        if op.kind == "indexer":
            heads = indexer_heads or op.n
            if f"{indexer_q}_h{heads}" not in self.indexer:
                raise KeyError(f"no indexer term for {indexer_q} queries and {heads} heads "
                               f"(measured: {', '.join(sorted(self.indexer))})")
            return self.indexer[f"{indexer_q}_h{heads}"].time(op.m, op.tokens) * op.count
        if op.kind == "attention":
            launch, eff = self.attention[op.dtype]
            roof = max(op.bytes / self.roofline["hbm_bw"], op.flops / self.roofline["bf16_flops"])
            return (launch + roof / eff) * op.count if op.tokens else 0.0
        if op.kind == "elementwise":
            r = self.rates.get(("elementwise", "bf16"))
            return (r.time(op.bytes) if r else self.graph_launch_s) * op.count
        return self.rate(op.kind, op.dtype).op_time(op) * op.count

    def rate(self, kind: str, dtype: str) -> Rate:
        """The fitted term of a GEMM kind. TP-sliced routed experts (``grouped_gemm_tp_*``) take the
        term of ``tp_moe_kernel``: by default SGLang's Triton fused MoE (``fused_moe_tp_*``), else
        ``torch._scaled_grouped_mm`` at the slice shapes (``grouped_gemm_tp_*``); a calibration
        without the chosen kernel's term falls back along that order, then to the whole-expert
        ``grouped_gemm`` term (an extrapolation: the slices run slower per weight byte)."""
        if kind in TP_MOE_KINDS.values():
            for cand in self.tp_moe_candidates(kind):
                if (cand, dtype) in self.rates:
                    return self.rates[(cand, dtype)]
        if (kind, dtype) not in self.rates:  # a KeyError from deep inside a simulation was a traceback
            from ..errors import HisparseError

            raise HisparseError(f"the calibration's step_terms have no {kind} {dtype} term (fitted: "
                                f"{', '.join(f'{k} {d}' for k, d in sorted(self.rates))}); refit it from complete "
                                "tables (hisparse calibrate --terms step)")
        return self.rates[(kind, dtype)]

    def tp_moe_candidates(self, kind: str) -> list[str]:
        """Term kinds tried for a TP slice op of ``kind``, first found prices it."""
        name = next(n for n, k in TP_MOE_KINDS.items() if k == kind)
        order = [self.tp_moe_kernel] + [k for k in TP_MOE_KERNELS if k != self.tp_moe_kernel]
        return [TP_MOE_KERNELS[k][name] for k in order] + ["grouped_gemm"]

    def swap_in_time(self, missed_rows: float, requests: int, row_bytes: int) -> float:
        """One layer's swap-in launch (issue 8's fit for this row size)."""
        launch, per_req, bw = self.swap_in[row_bytes]
        return launch + per_req * requests + missed_rows * row_bytes / bw

    def ops_time(self, ops: list[Op], **kw) -> float:
        return float(sum(self.op_time(o, **kw) for o in ops))

    def breakdown(self, ops: list[Op], **kw) -> dict[str, float]:
        """Seconds per op name (for reports)."""
        out: dict[str, float] = {}
        for o in ops:
            out[o.name] = out.get(o.name, 0.0) + self.op_time(o, **kw)
        return out


def relative_error(predicted, measured) -> np.ndarray:
    return np.abs(np.asarray(predicted, float) - np.asarray(measured, float)) / np.asarray(measured, float)


def step_time(terms: StepTerms, m, batch: int, ctx_sum, layout=None, *, kv_row_bytes: int = 1152,
              indexer_q: str = "fp8", include_attention: bool = True) -> dict[str, np.ndarray]:
    """Seconds of one decode step on one GPU (DP rank) by op kind, for ``batch`` requests whose
    contexts sum to ``ctx_sum`` (a number or an array, one entry per step): every kernel of the
    dense layers, the MoE layers and the head (``ops.step_ops``) priced by the fitted terms.
    Swap-in and communication are not in it (``swap_in_time``; the serving model's comm term).
    ``include_attention=False`` leaves sparse attention out for a caller that prices it itself.
    Returns {kind: seconds} with a "total" entry; the context-dependent kinds (indexer, attention)
    are arrays shaped like ``ctx_sum``. With unequal contexts the indexer's select term follows
    the mean context per request (it is really paced by the longest in each wave of 132)."""
    from .ops import Layout, step_ops

    layout = layout or Layout()
    ctx = np.asarray(ctx_sum, dtype=float)
    out: dict[str, np.ndarray] = {}
    if batch <= 0:
        return {"total": ctx * 0.0}
    for repeat, ops in step_ops(m, batch, 1.0, layout, kv_row_bytes=kv_row_bytes):
        for op in ops:
            if op.kind == "indexer":
                t = terms.indexer[f"{indexer_q}_h{m.indexer_heads}"]  # replicated (ops.attention_ops)
                sec = t.launch_s + ctx * 132 / t.bw + t.select_s_per_token * math.ceil(batch / t.sms) * ctx / batch
            elif op.kind == "attention":
                if not include_attention:
                    continue
                launch, eff = terms.attention[op.dtype]
                k_rows = np.minimum(m.top_k, ctx / batch)
                heads = m.attention_heads // layout.attention_tp
                roof = np.maximum(batch * k_rows * kv_row_bytes / terms.roofline["hbm_bw"],
                                  2.0 * batch * heads * k_rows * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
                                  / terms.roofline["bf16_flops"])
                sec = launch + roof / eff
            else:
                sec = terms.op_time(op)
            out[op.kind] = out.get(op.kind, 0.0) + repeat * sec
    out["total"] = sum(out.values()) + ctx * 0.0
    return out
