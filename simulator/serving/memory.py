"""Per-GPU memory model: how many requests fit, baseline versus HiSparse.

With DP attention each GPU holds the attention state of its own requests, so everything here is
per GPU. Baseline: a request holds its whole context's MLA KV and indexer keys in HBM.
HiSparse: a hot buffer of ``device_buffer_size`` rows plus one reserved 64-slot page per layer,
and the indexer keys of the whole context (they stay on the GPU); its full KV lives in the host
pool (``host_to_device_ratio`` x the device KV pool, capped by the node's host memory).
Colocated HiSparse also stages one prompt's full KV in HBM while it prefills. Requests reserve
their whole context (input + output) when admitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .presets import DeploymentSpec, GpuSpec, HiSparseSpec, ModelSpec

RESERVED_PAGE = 64
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class MemoryPlan:
    system: str
    weights_bytes: float  # per GPU
    kv_pool_bytes: float  # per GPU, for request state
    staging_bytes: float  # per GPU, one prompt's KV during colocated HiSparse prefill
    device_bytes_per_request: float
    host_pool_bytes: float  # per GPU
    host_bytes_per_request: float
    max_running_per_gpu: int
    limited_by: str

    def device_used(self, running: float) -> float:
        return self.weights_bytes + self.staging_bytes + running * self.device_bytes_per_request

    def host_used(self, running: float) -> float:
        return running * self.host_bytes_per_request


def plan_memory(model: ModelSpec, gpu: GpuSpec, dep: DeploymentSpec, hisparse: HiSparseSpec | None,
                context_tokens: int, prompt_tokens: int) -> MemoryPlan:
    """Memory per GPU for requests of ``context_tokens`` (input + output) tokens."""
    weights = model.weight_bytes / dep.tp
    pool = gpu.hbm_bytes * dep.mem_fraction - weights - dep.activation_reserve_bytes
    indexer = context_tokens * model.indexer_bytes_per_token()
    if hisparse is None:
        per_req = context_tokens * model.kv_bytes_per_token() + indexer
        n = int(max(pool, 0) // per_req)
        return MemoryPlan("baseline", weights, pool, 0.0, per_req, 0.0, 0.0, n, "hbm")
    staging = prompt_tokens * model.kv_bytes_per_token() if dep.mode == "colocated" else 0.0
    per_req = (hisparse.device_buffer_size + RESERVED_PAGE) * model.layers * model.kv_row_bytes + indexer
    host_per_req = context_tokens * model.kv_bytes_per_token()
    host_pool = min(max(pool, 0) * hisparse.host_to_device_ratio,
                    dep.host_bytes / min(dep.gpus, GPUS_PER_NODE))
    by_hbm = int(max(pool - staging, 0) // per_req)
    by_host = int(host_pool // host_per_req)
    return MemoryPlan("hisparse", weights, pool, staging, per_req, host_pool, host_per_req,
                      min(by_hbm, by_host), "hbm" if by_hbm <= by_host else "host")
