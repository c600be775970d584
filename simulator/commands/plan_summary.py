"""The scenario's figures a plan reports beside its points: the memory per rank, the decode step by
term and how each term is priced, and what the IndexShare prefetch hides (``plan``'s JSON and text,
``plan --search``'s report)."""

from __future__ import annotations


def scenario_summary(sc) -> dict:
    from ..serving.memory import plan_memory

    base = plan_memory(sc.model, sc.gpu, sc.deployment, None, where=sc.files)
    hi = plan_memory(sc.model, sc.gpu, sc.deployment, sc.hisparse, where=sc.files)
    d = sc.deployment
    return {"files": {"model": sc.model.where, "gpu": sc.gpu.where, "deployment": d.where,
                      "workload": sc.workload.where, "hisparse": sc.hisparse.where},
            "calibration": sc.calibration, "calibrated": sc.params.calibrated, "overrides": list(sc.overrides),
            "trace": {"file": sc.trace, "how": sc.trace_how},
            "unsourced_terms": list(sc.params.unsourced), "notes": list(sc.notes),
            "step_terms": _step_terms_summary(sc),
            "decode_step_ms": _step_report(sc, base),
            "term_sources": sc.cost_model(deployment=d).term_sources(),
            "layout": {"gpus": d.gpus, "instances": d.instances, "ranks": d.ranks, "attn_tp": d.attn_tp,
                       "attention": d.attention.value, "mode": d.mode.value, "moe": d.moe.value},
            "memory_per_rank": {"baseline": base.__dict__, "hisparse": hi.__dict__}}


def _step_report(sc, base) -> dict:
    """A baseline decode step at its full batch (the running cap or the pool, per scheduler), every
    request at the workload's mean context, by term group (ms)."""
    w = sc.workload
    ctx = w.input_tokens + w.output_tokens / 2
    full = max(1, min(base.max_running, base.pool_tokens // (w.input_tokens + w.output_tokens)))
    c = sc.cost_model()
    return {"requests_per_scheduler": full, "context_tokens": ctx, **c.step_report(full, ctx)}


def prefetch_report(sc, plan) -> dict | None:
    """What the IndexShare prefetch hides of a HiSparse decode step's swap-in (costmodel/indexshare.py),
    at one request and at the HiSparse full batch per scheduler, every request at the workload's mean
    context missing the trace's steady miss ratio; None for a model without shared layers."""
    from ..costmodel.passes import CostModel, Pass, PassShape
    from ..serving.memory import plan_memory

    m, d, w, hs = sc.model, sc.deployment, sc.workload, sc.hisparse
    if not m.shared_layers or not plan.knobs:
        return None
    hi = plan_memory(m, sc.gpu, d, hs, where=sc.files)
    full = max(1, min(hi.max_running, hi.pool_tokens // max(hi.buffer_slots, 1)))
    ctx = w.input_tokens + w.output_tokens / 2
    miss = plan.knobs[0].steady_miss_ratio
    on = hs.prefetch and getattr(d, "pp", 1) == 1
    cost = CostModel(m, sc.gpu, d, sc.params, sc.terms, prefetch=True)
    points = []
    for batch in sorted({1, full}):
        p = Pass.uniform(batch, ctx, d.ranks_per_instance, hisparse=True,
                         missed_rows=miss * min(hs.top_k, ctx) * m.layers * batch)
        work = p.ranks[0]
        total = float(cost.swap_in(work.missed_rows, batch))
        hidden = float(cost.prefetch_hidden(PassShape.of(cost, p), work))
        points.append({"requests_per_scheduler": batch, "swap_in_ms": total * 1e3, "hidden_ms": hidden * 1e3,
                       "hidden_share": hidden / total if total > 0 else 0.0})
    return {"enabled": on, "anchors": m.indexer_layers, "shared": m.shared_layers, "miss_ratio": miss,
            "context_tokens": ctx, "points": points,
            "published": "SGLang PR #29637: prefetch 'hides 70% of the IO latency' (its benchmark; setup not "
                         "stated); PR #28523: ITL overhead over no-HiSparse 7.17 -> 3.18 ms (56% hidden)"}


def _step_terms_summary(sc) -> dict:
    from ..costmodel.ops import dtype_of
    from ..costmodel.pricing import terms_for

    t = sc.terms or terms_for(sc.gpu)
    fp4 = t.fp4 if dtype_of(sc.model.bytes_per_param("routed_expert")) == "fp4" else ""
    bf16 = t.bf16 if sc.model.arch == "mla" else ""  # every MLA checkpoint's absorbed bmm (ops.ABSORBED_BMM_DTYPE)
    return {"source": t.source, "scaled_from_h200": t.scaled, "hbm_ratio": t.hbm_ratio, "flops_ratio": t.flops_ratio,
            "fp4": fp4, "bf16": bf16}
