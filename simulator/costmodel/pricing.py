"""The measured decode-step terms a deployment's cost model prices each op with.

``hisparse calibrate`` times every kernel of a DSA decode step on the H200 (GEMMs at GLM-5.1's
and DeepSeek-V3.2's per-GPU shapes, elementwise kernels in CUDA graphs, the lightning indexer,
sparse attention) and fits ``launch + max(bytes / bandwidth, FLOPs / rate)`` per kind and dtype
(``simulator/costmodel/terms.py``; stored under ``step_terms`` and ``fit`` in
``calibration/h200.json``). A calibration that holds these groups prices its own GPU. Any other GPU
takes the H200's terms with each rate scaled by a datasheet ratio, target / H200:

- every bandwidth term (GEMM weight reads, elementwise, grouped GEMMs, the indexer's key reads,
  the sparse-attention roofline's row reads) by the HBM bandwidth ratio;
- every FLOP-rate term (dense BF16 and FP8 GEMMs, the attention roofline) by the dense BF16 tensor
  rate ratio (FP8 is twice BF16 on every shipped GPU, ``GpuSpec.fp8_flops``, so the ratio is the same);
- every fitted per-kernel floor (each kernel kind's launch intercept, the CUDA-graph node, the
  attention and indexer launches) by the SM boost clock ratio, H200 / target (``floor_ratio``): a
  kernel at zero work is a fixed number of SM cycles (block scheduling, prologue, the dependent
  loads of a latency-bound kernel, epilogue), so its time goes as 1 / clock. Each preset's
  ``sm_boost_mhz`` is its vendor FP32 vector rate over 2 x its FP32 cores (NVIDIA's definition of that
  rate). Where no vendor figure is published (the H20s) the H200's floors are kept (INFERRED). The
  DRAM-latency part of a floor does not follow the SM clock (no per-kernel split was found: the
  whole floor is scaled);
- the indexer's per-request select time and the attention efficiency unchanged (INFERRED; the plan
  output says the terms are scaled).

The GPU presets' ``hbm_bw`` and ``bf16_flops`` are datasheet figures except the H200's (measured
here); the H200 preset keeps its datasheet figures in ``datasheet_hbm_bw`` / ``datasheet_bf16_flops``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import HisparseError
from ..serving.specs import Attention, DeploymentSpec, GpuSpec, ModelSpec, MoeA2ABackend, MoeLayout
from .ops import Layout, dtype_of
from .terms import StepTerms

REFERENCE_GPU = "h200"  # the GPU whose measured step terms other GPUs scale (simulator/presets/calibration/h200.json)


@dataclass(frozen=True)
class GpuTerms:
    """Step terms for one GPU: the fitted kernels, the roofline the attention fit divides by, and
    where they come from."""

    terms: StepTerms
    hbm_bw: float  # attention roofline: row bytes / this
    bf16_flops: float  # attention roofline: FLOPs / this
    source: str
    hbm_ratio: float = 1.0
    flops_ratio: float = 1.0
    floor_ratio: float = 1.0  # the H200's fitted per-kernel floors x this (SM boost clock, H200 / this GPU)
    floor_source: str = ""  # how the floors were carried to this GPU ('' measured on it)
    fp4: str = ""  # how FP4-weight GEMMs are priced on this GPU (a derivation from the FP8 terms)
    bf16: str = ""  # how BF16 GEMM kinds timed only in FP8 are priced (a derivation from the FP8 terms)

    @property
    def scaled(self) -> bool:
        return self.hbm_ratio != 1.0 or self.flops_ratio != 1.0 or self.floor_ratio != 1.0


def datasheet_rates(gpu: GpuSpec) -> tuple[float, float]:
    """(HBM bytes/s, dense BF16 FLOP/s) from the GPU's datasheet."""
    return (gpu.datasheet_hbm_bw or gpu.hbm_bw, gpu.datasheet_bf16_flops or gpu.bf16_flops)


@lru_cache(maxsize=4)
def _reference_json() -> tuple[str, str]:
    from ..serving import presets as P  # the packaged reference calibration is a preset

    path = P.resolve("calibration", REFERENCE_GPU)
    return str(path), path.read_text()


@lru_cache(maxsize=1)
def reference_gpu() -> GpuSpec:
    """The GPU preset the measured terms were taken on (``REFERENCE_GPU``)."""
    from ..serving import presets as P  # the packaged reference GPU is a preset

    return P.load("gpus", REFERENCE_GPU)


def flops_ratio(ref_gpu: GpuSpec, gpu: GpuSpec) -> float:
    """``gpu``'s dense BF16 tensor rate over ``ref_gpu``'s, both from their datasheets (FP8 is twice BF16 on
    every shipped GPU, so the same ratio scales FP8 terms)."""
    return datasheet_rates(gpu)[1] / datasheet_rates(ref_gpu)[1]


# The GEMM terms every model's decode step prices (``ops.layer_ops``: the FP8 projections and routed experts,
# the BF16 cuBLAS GEMMs, whose term also prices the absorbed bmm: ``StepTerms.with_bf16``).
REQUIRED_RATES = (("gemm", "fp8"), ("gemm", "bf16"), ("grouped_gemm", "fp8"))


def measured_terms(groups: Mapping[str, Any], label: str) -> GpuTerms | None:
    """The step terms a calibration file holds (``step_terms`` and ``fit``), or None."""
    if "step_terms" not in groups or "fit" not in groups:
        return None
    try:
        terms = StepTerms.from_calibration(dict(groups))
    except (KeyError, TypeError, ValueError) as exc:
        raise HisparseError(f"{label}: step_terms: missing or bad entry {exc}") from None
    missing = [f"{k} {d}" for k, d in REQUIRED_RATES if (k, d) not in terms.rates]
    if missing:  # a refit from a table cut short: refused here, not as a KeyError mid-simulation
        raise HisparseError(f"{label}: step_terms.rates: no {', '.join(missing)} term (every decode step prices "
                            "it); refit it from complete tables (hisparse calibrate --terms step)")
    return GpuTerms(terms, terms.roofline["hbm_bw"], terms.roofline["bf16_flops"], f"measured on this GPU ({label})")


def reference_terms() -> GpuTerms:
    where, text = _reference_json()
    found = measured_terms(json.loads(text), where)
    if found is None:
        raise HisparseError(f"{where}: no step_terms group (run hisparse calibrate --terms step)")
    return found


def floor_ratio(ref_gpu: GpuSpec, gpu: GpuSpec) -> tuple[float, str]:
    """(factor on the reference GPU's fitted per-kernel floors, how it was found) for ``gpu``: the
    reference's SM boost clock over ``gpu``'s, both from vendor figures (``GpuSpec.sm_boost_mhz``); 1.0,
    INFERRED, where either is not published."""
    if ref_gpu.sm_boost_mhz > 0 and gpu.sm_boost_mhz > 0:
        r = ref_gpu.sm_boost_mhz / gpu.sm_boost_mhz
        return r, (f"the H200's fitted per-kernel floors x {r:.3f}, the SM boost clock ratio {ref_gpu.sm_boost_mhz:.0f} / "
                   f"{gpu.sm_boost_mhz:.0f} MHz (vendor FP32 rate / 2 x FP32 cores: {ref_gpu.where}, {gpu.where}; "
                   "a kernel at zero work is a fixed number of SM cycles; its DRAM-latency part, which the clock "
                   "does not move, is not split out)")
    return 1.0, (f"the H200's fitted per-kernel floors kept on {gpu.name} (INFERRED: no vendor SM clock figure for "
                 f"{gpu.name if gpu.sm_boost_mhz <= 0 else ref_gpu.name}, sm_boost_mhz 0)")


def scaled_terms(ref: GpuTerms, ref_gpu: GpuSpec, gpu: GpuSpec) -> GpuTerms:
    """The reference GPU's terms with bandwidths and FLOP rates scaled by datasheet ratios and the
    per-kernel floors by the SM clock ratio (``floor_ratio``)."""
    ref_bw, ref_fl = datasheet_rates(ref_gpu)
    bw, fl = datasheet_rates(gpu)
    hr, fr = bw / ref_bw, flops_ratio(ref_gpu, gpu)
    cr, floors = floor_ratio(ref_gpu, gpu)
    terms = ref.terms.scaled(hr, fr, floor=cr)  # swap-in is priced from the GPU's own link (passes.py), not scaled here
    src = (f"H200 measurements ({ref.source.split('(')[-1].rstrip(')')}) scaled to {gpu.name}: bandwidths x {hr:.3f} "
           f"(HBM {bw / 1e12:.3g} / {ref_bw / 1e12:.3g} TB/s), FLOP rates x {fr:.3f} (dense BF16 "
           f"{fl / 1e12:.4g} / {ref_fl / 1e12:.4g} TFLOP/s; datasheets: {gpu.where}, {ref_gpu.where}); "
           + (f"kernel floors x {cr:.3f} (SM boost clock {ref_gpu.sm_boost_mhz:.0f} / {gpu.sm_boost_mhz:.0f} MHz)"
              if ref_gpu.sm_boost_mhz > 0 and gpu.sm_boost_mhz > 0 else "kernel floors as measured on the H200"))
    return GpuTerms(terms, terms.roofline["hbm_bw"], terms.roofline["bf16_flops"], src, hr, fr,
                    floor_ratio=cr, floor_source=floors)


def terms_for(gpu: GpuSpec, groups: Mapping[str, Any] | None = None, label: str = "") -> GpuTerms:
    """The calibration's own step terms when it has them, else the H200's scaled to ``gpu``; FP4
    GEMM terms derived from the FP8 ones (``with_fp4``)."""
    found = measured_terms(groups, label) if groups else None
    if found is None:
        found = scaled_terms(reference_terms(), reference_gpu(), gpu)
    return with_bf16(with_fp4(found, gpu))


def with_fp4(t: GpuTerms, gpu: GpuSpec) -> GpuTerms:
    """FP4-weight GEMMs (NVFP4 / MXFP4 experts), never timed here, priced from each FP8 term: the
    same launch and bandwidth over their own (fewer) weight bytes, the FLOP rate x ``fp4_flops_ratio``.
    A derivation: the source says so."""
    ratio, why = fp4_flops_ratio(gpu)
    return dataclasses.replace(t, terms=t.terms.with_fp4(ratio),
                               fp4=f"FP4 weights: the FP8 terms at FP4 bytes, FLOPs x {ratio:.3g} ({why})")


def with_bf16(t: GpuTerms) -> GpuTerms:
    """BF16 twins of the GEMM kinds timed only in FP8 (``StepTerms.with_bf16``): the absorbed MLA bmm, which
    SGLang runs in BF16 for every MLA checkpoint on NVIDIA GPUs (``ops.ABSORBED_BMM_DTYPE``): a derivation the
    source names."""
    twin = t.terms.with_bf16()
    if twin is t.terms:
        return t
    return dataclasses.replace(t, terms=twin, bf16=("the absorbed w_kc / w_vc batched GEMM (torch.bmm in BF16: SGLang "
                                                    "dequantises a 128 x 128 block-FP8 kv_b_proj to BF16 on CUDA, and GLM "
                                                    "ships it in BF16; post_load_weights) priced by the measured cuBLAS "
                                                    "BF16 GEMM term"))


def layout_for(dep: DeploymentSpec, model: ModelSpec) -> Layout:
    """costmodel.ops's Layout for a deployment (one GPU's share of a step), ``Layout.of`` SGLang's flags.

    DP attention (``--dp dp --enable-dp-attention``): attention on the rank's ``tp / dp`` GPUs, the
    MLP side sees the tokens of the instance's ``dp`` ranks. TP attention: heads over the instance's
    ``tp`` GPUs, one scheduler (``dp`` 1). Dense MLPs, the shared expert and the lm_head split over
    ``tp``, except the shared expert under ``--moe-a2a-backend deepep``: whole on every GPU, on the
    rank's own tokens (``Layout.shared_replicated``, SGLang ``DeepseekV2MoE``). Routed experts: ``moe = "tp"`` (SGLang's default fused MoE) splits each expert's
    intermediate over the ``tp`` GPUs; ``"ep"`` places E/tp whole experts per GPU. Both move the same
    weight bytes per GPU, at different rates: each layout's routed experts have their own measured
    term (``grouped_gemm`` whole experts; the TP slices, N 512 and K 256 for GLM-5.1, by the Triton
    fused MoE SGLang runs there, ``fused_moe_tp_up`` / ``_down``: ``calibrate --terms fused-moe-tp``;
    the earlier ``torch._scaled_grouped_mm`` terms ``grouped_gemm_tp_*`` stay selectable through
    ``step_terms.tp_moe_kernel``: ``StepTerms.rate``).
    """
    dtype = dtype_of(model.bytes_per_param("attention"))
    for tensor in ("dense", "shared_expert"):
        if dtype_of(model.bytes_per_param(tensor)) != dtype:
            raise HisparseError(f"{model.where}: {tensor}_bytes_per_param {model.bytes_per_param(tensor)} is another "
                                f"format than the attention weights' ({dtype}): the step prices them in one format "
                                "(only the routed experts may differ)")
    routed = model.bytes_per_param("routed_expert")
    expert_dtype = dtype_of(routed)
    dp = dep.dp if dep.attention == Attention.DP else 1
    return Layout.of(dep.tp, dp, "ep" if dep.moe == MoeLayout.EP else "tp", weight_dtype=dtype,
                     expert_dtype=expert_dtype if expert_dtype != dtype else "",
                     expert_bytes=routed if expert_dtype == "fp4" else 0.0,
                     shared_replicated=dep.a2a_backend == MoeA2ABackend.DEEPEP)


def fp4_flops_ratio(gpu: GpuSpec) -> tuple[float, str]:
    """(FP4 over FP8 dense tensor rate, why) for pricing FP4-weight GEMMs from the FP8 terms."""
    if gpu.fp4_flops > 0:
        return gpu.fp4_flops / gpu.fp8_flops, f"{gpu.name}'s FP4 tensor rate {gpu.fp4_flops / 1e15:.3g} PFLOP/s (datasheet)"
    return 1.0, (f"{gpu.name} has no FP4 tensor cores: FP4 weights are widened in the kernel and multiply at the "
                 "FP8 rate (INFERRED)")
