"""SGLang's memory accounting for DeepSeek-V4 (one attention rank), per layer kind.

Read from sgl-project/sglang ``model_executor/pool_configurator.py`` (``DSV4PoolConfigurator``) and
``mem_cache/deepseek_v4_memory_pool.py``:

- every row (sliding window, C4, C128) is 584 B: 448 FP8 nope + 64 bf16 rope + 7 scales + 1 pad
  (``get_bytes_per_token``); an indexer key row is 128 FP8 + one fp32 scale = 132 B;
- one "full" (logical) token costs ``bytes_per_full_token`` = ``swa_full_tokens_ratio`` x 584 x all
  layers (the SWA pool is that share of the full pool) + 584 / (4 x shrink) x C4 layers + 584 / 128 x
  C128 layers + 132 / 4 x C4 layers (indexer keys) + the C4 compress-state rings; HiSparse shrinks the
  C4 device pool by ``host_to_device_ratio`` (``c4_shrink_factor``) and adds 8 / 4 + 1 / window B of
  slot mapping; ``full = (available - fixed) / bytes_per_full_token`` (page 256), fixed = HiSparse's
  per-request tables (``_estimate_hisparse_fixed_overhead_bytes``);
- C4 device pool: ``full // (4 x ratio)`` compressed rows (SGLang main), or, with
  ``HiSparseSpec.c4_pool = "request"``, a hot buffer of ``device_buffer_size + c4 page`` rows per
  request slot (PR #33979, open: "size DSV4 C4 device pool by request capacity"; slots =
  max_running + 1 here);
- the host pool holds every logical token's C4 rows (``num_host_pages = size_full // 4``), pages of
  64 rows padded to 576 B multiples.

To reuse the serving model's slot arithmetic, the plan is in full-token units: baseline ``pool_tokens``
is the full pool; under HiSparse ``host_tokens`` is the full (logical) pool and ``pool_tokens`` the C4
device rows x 4 (one full token's share of a C4 row), a running request holding ``buffer_slots`` =
4 x (device_buffer_size + 64) of them, a prefilling colocated prompt its prompt's.
Left out: the C128 compress-state pool (request-scoped, a few rows per request), the SWA pool's own
limit (10% of the full tokens: far more than a 128-row window per request needs at long contexts).
"""

from __future__ import annotations

from ..errors import HisparseError
from .layer_kinds import LAYER_KINDS
from .memory import HOST_KEEP_FREE, MemoryPlan, host_ratio_hint, weights_per_gpu
from .specs import DeploymentSpec, GpuSpec, HiSparseSpec, ModelSpec

DSV4_PAGE = 256  # SGLang's DSV4 page_size (server_args log in sgl-project/sglang#23602: page_size=256)
SWA_FULL_TOKENS_RATIO = 0.1  # --swa-full-tokens-ratio default (same log: swa_full_tokens_ratio=0.1)
# Both C4 compress-state pools (attention + indexer) allocate 352 B per SWA token per C4 layer: PR #40337
# measured the pools at 2.00x the rows they address and "the waste is 176 B per SWA token per C4 layer"
C4_STATE_BYTES_PER_SWA_TOKEN = 352.0
INDEXER_QUANT_BLOCK = 128


def c4_page(page: int = DSV4_PAGE) -> int:
    """Compressed rows per C4 page (``max(1, page_size // 4)``)."""
    return max(1, page // 4)


def bytes_per_full_token(model: ModelSpec, hisparse: HiSparseSpec | None) -> float:
    """SGLang's ``DSV4PoolConfigurator._get_bytes_per_full_token``, the kinds from the model's table."""
    n = model.kind_counts
    row = model.kv_row_bytes
    shrink = hisparse.host_to_device_ratio if hisparse else 1.0
    c4, c128 = n.get("c4", 0), n.get("c128", 0)
    out = SWA_FULL_TOKENS_RATIO * row * model.layers
    out += row / (LAYER_KINDS["c4"].compress * shrink) * c4
    out += row / LAYER_KINDS["c128"].compress * c128
    out += model.indexer_row_bytes / LAYER_KINDS["c4"].compress * c4
    out += SWA_FULL_TOKENS_RATIO * C4_STATE_BYTES_PER_SWA_TOKEN * c4
    if hisparse:
        out += 8 / 4 + 1 / max(1, model.sliding_window)
    return out


def hisparse_fixed_bytes(model: ModelSpec, hisparse: HiSparseSpec, req_slots: int) -> int:
    """SGLang's ``_estimate_hisparse_fixed_overhead_bytes``: the coordinator's per-request tables."""
    page = c4_page()
    padded = hisparse.device_buffer_size + page
    max_compressed = (max(model.context_length, 1) + 4 + 3) // 4
    c4 = model.kind_counts.get("c4", 0)
    out = req_slots * padded * 8 + req_slots * (max_compressed + page) * 8
    out += 2 * c4 * req_slots * padded * 4 + c4 * req_slots * hisparse.device_buffer_size * 2
    out += hisparse.device_buffer_size * 2 + padded * 4 + 2 * req_slots * hisparse.top_k * 4 + c4 * 8 + (page + 1) * 8
    return int(out)


def _running_cap(tokens: int, model: ModelSpec, dep: DeploymentSpec, where: str) -> tuple[int, int]:
    estimated = min(max(int(tokens / model.context_length * 512), 2048), 4096) if model.context_length else 4096
    derived = min(estimated, tokens // 2)
    if dep.max_running_requests:
        running = min(dep.max_running_requests // dep.ranks_per_instance, tokens // 2)
        if running < 1:
            raise HisparseError(f"{where}: max_running_requests {dep.max_running_requests} is below one request "
                                f"per DP rank ({dep.ranks_per_instance} ranks)")
        return running, derived
    return derived, derived


def plan_memory_dsv4(model: ModelSpec, gpu: GpuSpec, dep: DeploymentSpec, hisparse: HiSparseSpec | None, *,
                     where: str = "") -> MemoryPlan:
    weights = weights_per_gpu(model, dep)
    budget = gpu.free_before_load * dep.mem_fraction_static - weights
    if budget <= 0:
        raise HisparseError(
            f"{where}: no room for a KV pool: {model.name} weights take {weights / 1e9:.1f} GB per GPU, more than "
            f"mem_fraction_static {dep.mem_fraction_static:g} x {gpu.free_before_load / 1e9:.1f} GB free of {gpu.name} "
            f"(SGLang: 'Not enough memory'; use more GPUs per instance or a larger mem_fraction_static)")
    bpf = bytes_per_full_token(model, hisparse)
    slots = (dep.max_running_requests // dep.ranks_per_instance if dep.max_running_requests else 2048) + 1
    fixed = hisparse_fixed_bytes(model, hisparse, slots) if hisparse else 0
    request_pool = bool(hisparse) and getattr(hisparse, "c4_pool", "token") == "request"
    c4_layers = model.kind_counts.get("c4", 0)
    per_request_c4 = (hisparse.device_buffer_size + c4_page()) if hisparse else 0
    if request_pool:  # PR #33979: the C4 device rows are a fixed per-slot hot buffer, not per full token
        bpf -= model.kv_row_bytes / (4 * hisparse.host_to_device_ratio) * c4_layers
        fixed += slots * per_request_c4 * model.kv_row_bytes * c4_layers
    full = int((budget - fixed) / bpf) // DSV4_PAGE * DSV4_PAGE if budget > fixed else 0
    if dep.max_total_tokens:
        full = min(full, dep.max_total_tokens // DSV4_PAGE * DSV4_PAGE)
    if full <= 0:
        raise HisparseError(
            f"{where}: no room for a KV pool: {model.name} takes {bpf:.0f} B per token (sliding windows, C4 / C128 "
            f"rows and indexer keys of {model.layers} layers) plus {fixed / 1e9:.2f} GB of HiSparse tables, more than "
            f"the {budget / 1e9:.3g} GB per GPU left after {weights / 1e9:.1f} GB of weights")
    running, derived_running = _running_cap(full, model, dep, where)
    row_c4 = model.kv_row_bytes / LAYER_KINDS["c4"].compress  # one full token's share of a C4 row
    if not hisparse:
        return MemoryPlan("baseline", weights, budget, int(round(bpf)), full, full, full, 0.0, running,
                          derived_running, 0, int(round(bpf)), 1, int(round(bpf)))
    c4_rows = slots * per_request_c4 if request_pool else full // int(4 * hisparse.host_to_device_ratio)
    pool = c4_rows * 4  # in full-token units
    padded_page = -(-c4_page() * model.kv_row_bytes // 576) * 576  # bytes_per_page_padded
    host_pool = full / 4 / c4_page() * padded_page * c4_layers
    node_need = host_pool * min(dep.gpus, gpu.gpus_per_node)
    if node_need > dep.host_bytes - HOST_KEEP_FREE:
        raise HisparseError(
            f"{where}: HiSparse host pools need {node_need / 1e9:.0f} GB of pinned memory per node (the C4 rows of "
            f"{full} tokens x {c4_layers} layers per GPU, host_to_device_ratio {hisparse.host_to_device_ratio:g}) but "
            f"the node has {dep.host_bytes / 1e9:.0f} GB less 10 GiB that SGLang keeps free"
            + host_ratio_hint(hisparse, lambda hs: plan_memory_dsv4(model, gpu, dep, hs, where=where)))
    static = full * bpf + fixed
    return MemoryPlan("hisparse", weights, budget, max(1, int(round(static / max(pool, 1)))), pool, pool, full,
                      host_pool, running, derived_running, 4 * per_request_c4, max(1, int(round(row_c4))), c4_layers,
                      max(1, int(round(static / max(pool, 1)))))
