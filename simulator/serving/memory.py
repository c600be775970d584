"""SGLang's memory accounting for one attention rank (one scheduler, one KV pool).

Read from sgl-project/sglang (current upstream; files named at each step):

1. KV budget per GPU (``mem_cache/kv_cache_configurator.py``, ``_profile_available_bytes``; formerly
   ``model_executor/model_runner.py`` ``profile_max_num_token``): free memory before the weights
   load (``GpuSpec.free_before_load``: HBM less the CUDA context and communicators) times
   ``mem_fraction_static``, minus whatever is resident when it is measured: the weights (under
   ``--moe-a2a-backend deepep`` with the shared expert whole on every GPU; before PR #30531 with an
   indexer on every layer, ``IndexerCache``) and, under speculative decoding, the draft model's
   weights and its duplicate vocabulary tensors (PR #28855, #32468: ``draft_resident_bytes``).
   Activations, CUDA graphs, DeepEP's buffers and the HiSparse coordinator's tables live in the
   other ``1 - mem_fraction_static`` (no separate reserve here).
2. Token pool (``model_executor/pool_configurator.py``, ``DefaultPoolConfigurator``):
   ``max_total_num_tokens = budget // cell`` rounded down to a page (64 for DSA on CUDA), with
   ``cell = layers x (MLA row + indexer row x ratio)``; ``ratio`` is HiSparse's
   ``host_to_device_ratio`` (the indexer key buffer is sized for the whole logical pool,
   ``hisparse_memory_pool.py``: ``index_buf_size = size * host_to_device_ratio``), 1 without HiSparse.
   Releases before PR #31992 (2026-07-27; the blog's) budget a smaller cell (deployment key
   ``pool_profile = "before-31992"``, ``PoolProfile``): FP8 rows as 576 B, one indexer row under
   HiSparse too; the pool is larger and what it allocates beyond the budget comes out of the
   slack, which must hold it (else SGLang runs out of memory at start-up).
   Speculative decoding scales the cell by ``1 + draft layers / layers`` (PR #23862: the draft
   worker's KV pool, as many slots, is budgeted with the target's).
   The MLA cell is not divided by attention TP: under TP attention every GPU stores every token.
   ``--max-total-tokens`` (deployment key ``max_total_tokens``) caps it.
3. Running-request cap per rank (``kv_cache_configurator.py``, ``resolve_max_num_reqs``):
   ``min(max_running_requests // attn_dp_size, tokens // 2)`` when given (the blog's 480 over dp 8
   is 60 per rank), else ``min(clamp(tokens / context_len x 512, 2048, 4096), tokens // 2)``.
4. HiSparse (``mem_cache/allocator/hisparse.py``, ``managers/hisparse_coordinator.py``): the token
   pool is the device slots; a running request holds ``device_buffer_size + page_size`` of them (the
   reserved page holds the newest token); a colocated prompt holds one slot per prompt token while it
   prefills; the logical pool and the pinned host pool (``mem_cache/pool_host/base.py``) are
   ``ratio x`` the device slots, and a request holds its whole context there. The host pool must fit
   the node's memory less 10 GiB (``pool_host``: "preserve at least 10GB").

Which requests run is SGLang's scheduler arithmetic (``admission.py``), not a footprint here;
``footprint`` gives the whole-context reservation used by pd-decode admission and the check that a
request fits at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import HisparseError
from .specs import (
    Attention,
    DeploymentSpec,
    GpuSpec,
    HiSparseSpec,
    IndexerCache,
    Mode,
    ModelSpec,
    MoeA2ABackend,
    PoolProfile,
)

HOST_KEEP_FREE = 10 * (1 << 30)  # SGLang's host pool leaves 10 GiB of host memory free


def readable(amount: float) -> str:
    """A count of bytes or slots for an error message: whole below 1e12, else three significant
    digits (host_to_device_ratio = 1e300 printed a slot's bytes as a 300-digit integer)."""
    return f"{amount:.0f}" if abs(amount) < 1e12 else f"{amount:.3g}"


def indexer_cache_layers(model: ModelSpec, dep: DeploymentSpec) -> int:
    """Layers whose lightning indexer SGLang builds and whose index-K rows it allocates and budgets:
    the layers that run it (IndexShare anchors; DeepSeek-V4's C4 layers), or every MLA layer under
    ``indexer_cache = "before-30531"`` (``IndexerCache``: releases before PR #30531 build an
    ``Indexer`` and an index-K buffer on IndexShare's shared layers too, never used)."""
    if model.arch == "mla" and dep.indexer_cache == IndexerCache.BEFORE_30531:
        return model.layers
    return model.indexer_layers


def draft_vocab_bytes(model: ModelSpec, dep: DeploymentSpec) -> float:
    """Bytes per GPU of the draft (NextN) model's own vocabulary embedding and lm_head: SGLang
    constructs them with the draft model and repoints it at the target's only in
    ``EagleDraftWorker.alloc_memory_pool`` (``init_lm_head``), after the target's memory profile, so
    they are resident when the KV budget is measured and freed into the slack after
    (sgl-project/sglang PR #32468, open 2026-07-27: "the duplicate vocab tensors are resident when free
    memory is measured"). Laid out as the target's: the embedding replicated under DP attention
    (vocab-parallel otherwise), lm_head vocab-parallel over tp."""
    e = model.embedding_bytes_per_param
    embed_split = 1 if dep.attention == Attention.DP else dep.tp
    return model.embedding_params * e / embed_split + model.embedding_params * e / dep.tp


def weights_per_gpu(model: ModelSpec, dep: DeploymentSpec) -> float:
    """Weight bytes resident on one GPU for the deployment's layout (sglang_memory notes, section 3):
    MLA attention weights split over the rank's attention-TP GPUs (a full copy per GPU under DP
    attention with attn_tp 1); the lightning indexer's weights on every GPU whatever the layout
    (``layers/attention/nsa/nsa_indexer.py``, ``Indexer.__init__``: ``wq_b``, ``wk`` and
    ``weights_proj`` are ``ReplicatedLinear``; ``weights_proj`` is created bf16 without the quant
    config on CUDA, so it stays bf16 in an FP8 checkpoint); dense MLPs, shared and routed experts
    split over the instance's tp GPUs (a 1/tp slice of each expert, or E/tp whole experts under EP:
    the same bytes); router gates replicated; the embedding replicated under DP attention
    (vocab-parallel otherwise); lm_head vocab-parallel over tp (``ParallelLMHead(...,
    use_attn_tp_group=enable_dp_lm_head)``: over the attention-TP group, i.e. replicated at attn_tp 1,
    only with ``--enable-dp-lm-head``, which no shipped deployment passes). Plus the absorbed MLA
    matrices: after loading, SGLang splits kv_b_proj into ``w_kc`` / ``w_vc`` as new contiguous bf16
    tensors (block-FP8 checkpoints dequantised first) and keeps kv_b_proj itself for the MHA prefill
    path (``models/deepseek_common/deepseek_weight_loader.py``, ``post_load_weights``).
    Not here: the MTP / NextN layer (only with ``--speculative-algorithm``, as its own ``...NextN`` model:
    ``draft_resident_bytes``); DeepEP's buffers (``--moe-a2a-backend deepep``), which
    ``DeepEPBuffer.get_deepep_buffer`` builds inside the first dispatch (``token_dispatcher/deepep.py``
    ``_get_buffer``), i.e. in the CUDA-graph capture after the pool is sized, so out of the slack: its
    low-latency buffer (DeepEP ``LowLatencyLayout``, 128 tokens per rank, GLM's hidden 6144, 256
    experts) is 2 x (send + receive) x 256 x 128 x 12,480 B = 1.64 GB, the normal NVL buffer ~0.3 GB."""
    m = model
    e = m.embedding_bytes_per_param
    b = m.bytes_per_param
    attention = m.layers * m.attention_params / dep.attn_tp * b("attention")
    attention += m.layers * m.absorbed_mla_params / dep.attn_tp * 2  # w_kc + w_vc, bf16
    attention += m.dsv4_attention_extra_params / dep.attn_tp * b("attention")  # DeepSeek-V4 compressors
    gates = m.indexer_gate_params  # weights_proj: bf16, not quantised
    # replicated on every GPU; IndexShare's shared layers own no indexer since SGLang PR #30531 (before it
    # every layer built one: indexer_cache_layers)
    attention += indexer_cache_layers(m, dep) * ((m.indexer_params - gates) * b("attention") + gates * 2)
    mlp = (m.dense_layers * m.dense_mlp_params * b("dense")
           + m.moe_layers * m.experts * m.expert_params * b("routed_expert")) / dep.tp
    # the shared expert: split over tp, or whole on every GPU under DeepEP (SGLang DeepseekV2MoE builds it
    # with tp_rank=0, tp_size=1 when get_moe_a2a_backend().is_deepep(): DeepEP combines the routed output
    # and nothing all-reduces a TP-split shared expert)
    shared_split = 1 if dep.a2a_backend == MoeA2ABackend.DEEPEP else dep.tp
    mlp += m.moe_layers * m.shared_experts * m.expert_params * b("shared_expert") / shared_split
    router = m.moe_layers * m.router_params * 2  # bf16
    embed_split = 1 if dep.attention == Attention.DP else dep.tp
    embedding = m.embedding_params * e / embed_split + m.embedding_params * e / dep.tp
    return attention + mlp + router + embedding


def nextn_weights_per_gpu(model: ModelSpec, dep: DeploymentSpec) -> float:
    """Weight bytes per GPU of the MTP / NextN draft layer, loaded only with ``--speculative-algorithm
    EAGLE``.
    SGLang builds it as its own model (``...NextN``, log "Load weight end. ... type=...NextN"): one
    decoder layer of the target's shape (attention, indexer, MoE, router) laid out as the target's
    layers are, plus ``eh_proj`` (2 x hidden -> hidden, a plain bf16 linear) and norms; it reuses the
    target's embedding and lm_head (the NextN loader skips ``embed_tokens`` and ``shared_head.head``:
    "Use shared head and embed weights from target model", ``deepseek_weight_loader``). Its KV layer
    (one more MLA + indexer row per token) is not here."""
    m = model
    one = m.draft_model(1)
    no_embed = weights_per_gpu(one, dep) - m.embedding_params * m.embedding_bytes_per_param * (
        (1 if dep.attention == Attention.DP else 1 / dep.tp) + 1 / dep.tp)
    return no_embed + 2 * m.hidden_size * m.hidden_size * 2


def draft_resident_bytes(model: ModelSpec, dep: DeploymentSpec, spec) -> float:
    """Bytes per GPU the draft model holds when the target's KV budget is measured, so the budget
    loses them (sgl-project/sglang PR #28855, merged 2026-06-21, "account draft weights in
    --mem-fraction-static": the draft worker's weights load before the target's memory profile,
    ``_profile_available_bytes``: "If using speculative decoding, draft weights are now counted"):
    the draft layers' weights (``nextn_weights_per_gpu``) and the draft's own vocabulary tensors,
    freed only after the profile (``draft_vocab_bytes``, PR #32468)."""
    return nextn_weights_per_gpu(model, dep) * spec.draft_layers + draft_vocab_bytes(model, dep)


def speculative_memory(model: ModelSpec, dep: DeploymentSpec, spec, pool_tokens: int, max_running: int,
                       budgeted_draft_bytes: float = 0.0) -> float:
    """HBM per GPU speculative decoding takes beyond the KV budget, out of the ``1 - mem_fraction_static``
    slack (SGLang ``model_runner.py``): the draft worker's KV pool, sized ``pool + max_num_reqs x
    (num_steps x topk + num_draft_tokens) + 100`` slots (the target's pool gets the same headroom) of
    one MLA row and one indexer row per draft layer (DeepSeek-V4's SWA-only MTP layer: one row, no
    indexer row; an upper bound, its SWA pool is smaller), less ``budgeted_draft_bytes``, the share of it
    the profile already budgeted (PR #23862: ``DefaultPoolConfigurator`` scales the cell by ``1 + draft
    layers / layers``), and the target's headroom. Under HiSparse ``pool_tokens`` is the logical pool: the
    draft KV stays in its logical GPU space (PR #37771), beyond what the device-slot budget covered. The
    draft's weights are in the budget (``draft_resident_bytes``); activations and the draft's CUDA graphs
    are not counted."""
    headroom = max_running * (spec.num_steps * spec.eagle_topk + spec.num_draft_tokens) + 100
    draft = model.draft_model(spec.draft_layers)  # DeepSeek-V4: SWA rows only, no indexer row
    draft_kv = (pool_tokens + headroom) * (draft.kv_bytes_per_token() + draft.indexer_bytes_per_token())
    target_headroom = headroom * (model.kv_bytes_per_token() + model.indexer_bytes_per_token())
    return max(draft_kv - budgeted_draft_bytes, 0.0) + target_headroom


@dataclass(frozen=True)
class Footprint:
    """Slots one request holds: device (KV rows of all layers) and host/logical."""

    device: int
    host: int


@dataclass(frozen=True)
class MemoryPlan:
    """One attention rank's pools, derived as SGLang derives them (per GPU: every GPU of a rank holds
    the same pool)."""

    system: str  # "baseline" or "hisparse"
    weights_bytes: float  # per GPU
    budget_bytes: float  # per GPU: mem_fraction_static x HBM - weights (- the draft's, speculative decoding)
    cell_bytes: int  # HBM bytes per token slot (all layers; indexer x ratio under HiSparse)
    pool_tokens: int  # max_total_num_tokens: device slots
    pool_tokens_derived: int  # before a max_total_tokens override
    host_tokens: int  # logical (HiSparse: host) slots; baseline: = pool_tokens
    host_pool_bytes: float  # per GPU, pinned
    max_running: int  # per rank
    max_running_derived: int  # before a max_running_requests override
    buffer_slots: int  # HiSparse: device_buffer_size + page_size
    kv_row_bytes: int
    layers: int
    budget_cell_bytes: int = 0  # the cell the profile divided the budget by (< cell_bytes: "before-31992")

    @property
    def beyond_budget_bytes(self) -> float:
        """Per GPU: what the pool allocates beyond the KV budget, out of the slack ("before-31992")."""
        return self.pool_tokens * max(self.cell_bytes - self.budget_cell_bytes, 0)

    def footprint(self, input_tokens: int, output_tokens: int, *, prefilling: bool, prefill_on_device: bool) -> Footprint:
        """The one per-request formula: slots a request of these lengths holds."""
        ctx = input_tokens + output_tokens
        if self.system == "baseline":
            return Footprint(device=ctx, host=0)
        device = self.buffer_slots
        if prefilling and prefill_on_device:
            device = max(device, input_tokens)
        return Footprint(device=device, host=ctx)

    def device_bytes(self, slots: float) -> float:
        return slots * self.layers * self.kv_row_bytes

    def host_bytes(self, slots: float) -> float:
        return slots * self.layers * self.kv_row_bytes if self.system == "hisparse" else 0.0

    @property
    def static_bytes(self) -> float:
        """HBM held whatever runs: weights and the whole pool (SGLang allocates it at start-up)."""
        return self.weights_bytes + self.pool_tokens * self.cell_bytes


def legacy_cell_bytes(model: ModelSpec, dep: DeploymentSpec) -> int:
    """The cell SGLang's profile budgeted before PR #31992 (all layers): the MLA row as
    ``kv_lora_rank + qk_rope_head_dim`` elements of the KV dtype (1 byte for FP8 rows, whose real
    656 B add scales and a bf16 rope) plus one indexer row, with or without HiSparse
    (``pool_configurator.py`` at main 2026-04-10)."""
    elements = model.kv_lora_rank + model.qk_rope_head_dim
    dtype_bytes = 2 if model.kv_row_bytes >= 2 * elements else 1
    return model.layers * elements * dtype_bytes + indexer_cache_layers(model, dep) * model.indexer_row_bytes


def host_ratio_hint(hisparse: HiSparseSpec, plan: Callable[[HiSparseSpec], Any]) -> str:
    """The fix for a host pool the node cannot pin: the largest whole host_to_device_ratio below this one
    whose plan (``plan``: this deployment's memory plan for a HiSparse spec) fits. Found by planning each, not by
    scaling: the device pool grows as the ratio falls (fewer indexer keys per slot), so the host pool is not
    proportional to the ratio (ratio x have / need named ratios that still did not fit)."""
    import dataclasses

    for r in range(math.ceil(hisparse.host_to_device_ratio) - 1, 0, -1):
        try:
            plan(dataclasses.replace(hisparse, host_to_device_ratio=float(r)))
        except HisparseError:
            continue
        return f"; try --set hisparse.host_to_device_ratio={r} (the largest whole ratio that fits), or a " \
               "deployment with more host memory (host_bytes)"
    return "; a deployment with more host memory (host_bytes) or fewer GPUs per node"


def _page_floor(tokens: float, page: int) -> int:
    return int(tokens // page * page) if tokens > 0 else 0


def plan_memory(model: ModelSpec, gpu: GpuSpec, dep: DeploymentSpec, hisparse: HiSparseSpec | None, *,
                where: str = "", spec=None) -> MemoryPlan:
    """The pools of one attention rank, with ``where`` (the files) named in errors. ``spec``
    (speculative decoding): the running cap SGLang defaults to, and the draft layer's weights and
    KV pool checked against the slack (``speculative_memory``)."""
    if model.arch == "dsv4":  # per-kind pools (SGLang's DSV4PoolConfigurator): dsv4_memory.py
        from .dsv4_memory import plan_memory_dsv4

        return plan_memory_dsv4(model, gpu, dep, hisparse, where=where)
    weights = weights_per_gpu(model, dep)
    # speculative decoding: the draft's weights (and its duplicate vocabulary tensors) are resident when
    # the budget is measured (draft_resident_bytes)
    resident = draft_resident_bytes(model, dep, spec) if spec is not None else 0.0
    budget = gpu.free_before_load * dep.mem_fraction_static - weights - resident
    ratio = hisparse.host_to_device_ratio if hisparse else 1.0
    # index-K rows only on the layers that own an indexer (IndexShare elides the shared layers':
    # sglang DSATokenToKVPool ``indexer_layer_ids`` / ``indexer_layer_id_to_slot``)
    cell = model.layers * model.kv_row_bytes + int(indexer_cache_layers(model, dep) * model.indexer_row_bytes * ratio)
    target_budgeted = cell if dep.pool_profile == PoolProfile.SINCE_31992 else legacy_cell_bytes(model, dep)
    budgeted = target_budgeted
    if spec is not None:  # the draft worker's KV pool in the budget (PR #23862, DefaultPoolConfigurator)
        budgeted = int(target_budgeted * (1 + spec.draft_layers / model.layers))
    derived = _page_floor(budget // budgeted, dep.page_size)
    if derived <= 0 and budget > 0 and budget // budgeted < 1:  # the slot, not the weights
        raise HisparseError(
            f"{where}: no room for a KV pool: one token slot takes {readable(budgeted)} B ({model.layers} layers x "
            f"{model.kv_row_bytes} B KV + indexer keys for the x{ratio:g} logical pool), more than the "
            f"{budget / 1e9:.3g} GB per GPU left after {weights / 1e9:.1f} GB of weights"
            + (" (lower host_to_device_ratio)" if hisparse and ratio > 1 else ""))
    if derived <= 0 and budget > 0:
        raise HisparseError(
            f"{where}: no room for a KV pool: the {readable(budget // budgeted)} token slots of "
            f"{readable(budgeted)} B that fit in "
            f"the {budget / 1e9:.3g} GB per GPU left after the weights are less than one page of page_size "
            f"{dep.page_size} (lower page_size"
            + (f", or host_to_device_ratio {ratio:g}: a slot holds indexer keys for the x{ratio:g} logical pool)"
               if hisparse and ratio > 1 else ")"))
    if derived <= 0:
        raise HisparseError(
            f"{where}: no room for a KV pool: {model.name} weights take {weights / 1e9:.1f} GB per GPU"
            + (f" and the draft model {resident / 1e9:.1f} GB" if resident else "") + ", more than "
            f"mem_fraction_static {dep.mem_fraction_static:g} x {gpu.free_before_load / 1e9:.1f} GB free of {gpu.name} "
            f"(SGLang: 'Not enough memory'; use more GPUs per instance or a larger mem_fraction_static)")
    tokens = min(derived, dep.max_total_tokens) if dep.max_total_tokens else derived
    tokens = _page_floor(tokens, dep.page_size) or tokens
    host_tokens = int(tokens * ratio) if hisparse else tokens
    beyond = tokens * (cell - target_budgeted)
    slack = gpu.free_before_load * (1 - dep.mem_fraction_static)
    if beyond > slack:
        raise HisparseError(
            f"{where}: pool_profile = \"before-31992\": the KV pool of {readable(tokens)} slots allocates "
            f"{readable(cell)} B per slot (indexer keys for the x{ratio:g} logical pool) against the "
            f"{readable(target_budgeted)} B its profile budgeted: "
            f"{beyond / 1e9:.1f} GB per GPU beyond the budget, more than the {slack / 1e9:.1f} GB that "
            f"mem_fraction_static {dep.mem_fraction_static:g} leaves (SGLang runs out of memory at start-up; "
            "lower host_to_device_ratio or mem_fraction_static)")
    host_pool = host_tokens * model.layers * model.kv_row_bytes if hisparse else 0.0
    if hisparse:
        node_need = host_pool * min(dep.gpus, gpu.gpus_per_node)  # every GPU's worker pins its own pool
        if node_need > dep.host_bytes - HOST_KEEP_FREE:
            raise HisparseError(
                f"{where}: HiSparse host pools need {readable(node_need / 1e9)} GB of pinned memory per node "
                f"({readable(host_tokens)} slots x {model.layers * model.kv_row_bytes} B per GPU, host_to_device_ratio "
                f"{ratio:g}) but the node has {dep.host_bytes / 1e9:.0f} GB less 10 GiB that SGLang keeps free"
                + host_ratio_hint(hisparse, lambda hs: plan_memory(model, gpu, dep, hs, where=where, spec=spec)))
    if model.context_length:  # SGLang's context_len: the model's max_position_embeddings by default
        estimated = min(max(int(tokens / model.context_length * 512), 2048), 4096)
    else:
        estimated = 4096
    derived_running = min(estimated, tokens // 2)
    per_rank_attn_dp = dep.ranks_per_instance
    cap = dep.max_running_requests
    if spec is not None and not cap:
        from .speculative import SPEC_DEFAULT_MAX_RUNNING

        cap = SPEC_DEFAULT_MAX_RUNNING  # server_args: speculative decoding without --max-running-requests
    if cap:
        running = min(cap // per_rank_attn_dp, tokens // 2)
        if running < 1:
            raise HisparseError(f"{where}: max_running_requests {dep.max_running_requests} is below one request "
                                f"per DP rank ({per_rank_attn_dp} ranks)")
    else:
        running = derived_running
    system = "hisparse" if hisparse else "baseline"
    buffer_slots = hisparse.device_buffer_size + dep.page_size if hisparse else 0
    if spec is not None:
        need = speculative_memory(model, dep, spec, host_tokens if hisparse else tokens, running,
                                  budgeted_draft_bytes=tokens * (budgeted - target_budgeted))
        # the draft's duplicate vocabulary tensors are freed after the profile, back into the slack
        slack = gpu.free_before_load * (1 - dep.mem_fraction_static) - beyond + draft_vocab_bytes(model, dep)
        if need > slack:
            raise HisparseError(
                f"{where}: speculative decoding ({spec.label}): the draft's KV pool and both pools' headroom take "
                f"{need / 1e9:.1f} GB per GPU beyond the KV budget, more than the {slack / 1e9:.1f} GB that "
                f"mem_fraction_static {dep.mem_fraction_static:g} leaves (lower mem_fraction_static)")
    return MemoryPlan(system, weights, budget, cell, tokens, derived, host_tokens, host_pool, running,
                      derived_running, buffer_slots, model.kv_row_bytes, model.layers, target_budgeted)


def check_fits(plan: MemoryPlan, input_tokens: int, output_tokens: int, mode: Mode, where: str) -> None:
    """A request that can never be admitted is the user's error, named with the files."""
    fp = plan.footprint(input_tokens, output_tokens, prefilling=True, prefill_on_device=mode == Mode.COLOCATED)
    if fp.device > plan.pool_tokens:
        raise HisparseError(
            f"{where}: one request of {input_tokens} + {output_tokens} tokens needs {fp.device} KV slots on the GPU "
            f"but the {plan.system} pool holds {plan.pool_tokens} ({plan.budget_bytes / 1e9:.1f} GB after "
            f"{plan.weights_bytes / 1e9:.1f} GB of weights per GPU)"
            + ("; a colocated prompt keeps every chunk's device slots until its last chunk, then "
               "admit_request_into_staging copies it to the host (hisparse_coordinator.py); fix: a lower "
               "host_to_device_ratio (the device pool also holds the logical pool's indexer keys) or a pd-decode "
               "deployment (the prompt arrives in the host pool)"
               if plan.system == "hisparse" and mode == Mode.COLOCATED else
               "; fix: HiSparse (the context in host memory), FP8 KV (a -kvfp8 model preset), more GPUs per "
               "instance or a larger mem_fraction_static" if plan.system == "baseline" else ""))
    if plan.system == "hisparse" and fp.host > plan.host_tokens:
        raise HisparseError(
            f"{where}: one request of {input_tokens + output_tokens} tokens exceeds the HiSparse logical/host pool "
            f"of {plan.host_tokens} tokens (raise host_to_device_ratio)")
