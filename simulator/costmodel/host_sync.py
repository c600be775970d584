"""DeepEP normal-mode dispatch's host wait: the GPU idle gap it leaves in every MoE layer of an extend pass.

SGLang's extend passes under ``--moe-a2a-backend deepep`` run DeepEP's normal kernels
(``layers/moe/token_dispatcher/deepep.py`` ``_DeepEPDispatcherImplNormal._dispatch_core`` calls
``buffer.dispatch`` without ``num_worst_tokens``, and DeepGEMM's contiguous path needs the Python list
``num_recv_tokens_per_expert``). DeepEP's ``intranode_dispatch`` / ``internode_dispatch``
(deepseek-ai/DeepEP ``csrc/legacy/buffer.hpp``) launch ``notify_dispatch``, then, when
``num_worst_tokens`` is 0, the CPU busy-waits on ``moe_recv_counter`` and ``moe_recv_expert_counter``
in mapped pinned memory ("Synchronize total received tokens and tokens per expert"; DeepEP's own
comment: "CPU will busy-wait until GPU receive tensor size metadata from other ranks"), and only then
allocates the receive tensors (``recv_x``, ``recv_src_idx``, ``recv_topk_idx``, ``recv_topk_weights``,
``recv_x_scales``, ``recv_channel_prefix_matrix``, ``send_head``: 7 ``torch::empty``) and launches the
dispatch kernel. While it waits the GPU has nothing queued, so each MoE layer exposes the time from
the GPU's write of the counter to the dispatch kernel's start. The CPU cannot launch ahead of the
GPU by more than one layer; the rest of a layer's kernels are issued while the dispatch kernel and
the layer's GEMMs run (an extend pass's kernels take longer than their launches, see below), so
only the gap itself is added.

Measured (``benchmarks/host_sync.py``; ``benchmarks/results/host_sync-h100.csv``, 2026-12-06, an
H100 80GB HBM3 machine of this workplace, Intel Xeon host, PyTorch 2.11, CuPy 14.2; 2,000 repeats each):
a kernel writes a flag into mapped pinned memory, the CPU polls it, allocates 7 CUDA tensors through
PyTorch and launches the next kernel; CUDA events give the GPU's idle time between the two: median
26.4 us (p10 26.1, p90 29.2); without the allocations 2.6 us (poll, event record and launch). DeepEP
allocates in C++ (no Python per tensor), so 26.4 us is an upper bound of its gap and 2.6 us a lower;
the term takes the measured 26.4 us. An eager launch of a small PyTorch op costs 5.7-6.1 us of CPU on
the same host: a 1,024-token extend layer (~1.2-2.3 ms of GPU work, ``CostModel.pass_time``) would need
some 200-400 launches per layer for the CPU, not the GPU, to pace it, so the wait is the only exposed
part. The host here is not the cookbook's H200 host: the figure is a host-side cost, not scaled by
any GPU ratio.
"""

from __future__ import annotations

# benchmarks/results/host_sync-h100.csv: GPU idle between the counter write and the next kernel,
# with DeepEP's 7 receive-tensor allocations (through PyTorch's Python API: an upper bound of the C++ path)
DEEPEP_NORMAL_HOST_WAIT_S = 26.4e-6
DEEPEP_NORMAL_HOST_WAIT_FLOOR_S = 2.6e-6  # the same gap without the allocations (lower bound)
SOURCE = ("DeepEP csrc/legacy/buffer.hpp intranode_dispatch: the CPU busy-waits on moe_recv_counter when "
          "num_worst_tokens is 0 (SGLang's normal dispatch passes none); the GPU idle gap measured with "
          "benchmarks/host_sync.py on an H100 host: 26.4 us per MoE layer (2.6 us without the 7 allocations)")


def deepep_host_wait_s(moe_layers: int, per_layer_s: float = DEEPEP_NORMAL_HOST_WAIT_S) -> float:
    """Seconds an extend pass under DeepEP's normal dispatch idles the GPU: one host wait per MoE layer."""
    if moe_layers < 0 or per_layer_s < 0:
        raise ValueError(f"moe_layers {moe_layers} and per_layer_s {per_layer_s} must be >= 0")
    return moe_layers * per_layer_s
