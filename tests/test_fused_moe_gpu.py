"""GPU checks of the Triton fused-MoE GEMM (``cupy_kernels/fused_moe.py``) against the float64
reference (tests/test_fused_moe_reference.py is the CPU twin of the same semantics): fresh random
routing and data every run (seed printed on failure), outputs poisoned with NaN before each launch,
every tile configuration the calibration sweeps, with and without the swapped product."""

from __future__ import annotations

import os

import numpy as np
import pytest

from cupy_kernels import fused_moe_reference as ref

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("PyTorch sees no CUDA device", allow_module_level=True)

from cupy_kernels.fused_moe import BlockConfig, fused_moe_gemm  # noqa: E402
from simulator.calibration.fused_moe_measure import FUSED_MOE_CONFIGS  # noqa: E402


def _seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _dev(x, dtype):
    return torch.from_numpy(np.ascontiguousarray(x)).to("cuda").to(dtype)


def _run(seed, cfg, tokens, experts, top_k, n, k, down):
    rng = np.random.default_rng(seed)
    ids, rw = ref.uniform_routing(tokens, experts, top_k, seed)
    rows = tokens * top_k if down else tokens
    a_c, a_s = ref.quant_token_groups(rng.standard_normal((rows, k)).astype(np.float32))
    w_c = ref.fp8_round(rng.standard_normal((experts, n, k)) * 2)
    w_s = rng.uniform(0.005, 0.02, (experts, n // 128, k // 128)).astype(np.float32)
    al = ref.align_block_size(ids, experts, cfg.block_m)
    a_top_k = 1 if down else top_k
    want = ref.fused_moe_gemm_ref(a_c, a_s, w_c, w_s, al, a_top_k, routed_weights=rw if down else None)
    out = torch.full((al.valid, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    fused_moe_gemm(_dev(a_c, torch.float8_e4m3fn), _dev(a_s, torch.float32), _dev(w_c, torch.float8_e4m3fn),
                   _dev(w_s, torch.float32), _dev(al.sorted_ids, torch.int32), _dev(al.expert_ids, torch.int32),
                   torch.tensor([al.padded], dtype=torch.int32, device="cuda"), a_top_k, out, cfg,
                   routed_weights=_dev(rw.reshape(-1), torch.float32) if down else None)
    torch.cuda.synchronize()
    got = out.float().cpu().numpy().astype(np.float64)
    assert not np.isnan(got).any(), f"seed {seed} {cfg.label}: a valid row was not written"
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert err < 1e-2, f"seed {seed} {cfg.label}: relative error {err:.2e}"  # bf16 output: ~4e-3
    return err


@pytest.mark.parametrize("cfg", FUSED_MOE_CONFIGS, ids=lambda c: c.label)
def test_kernel_matches_reference_at_every_swept_config(cfg):
    seed = _seed()
    _run(seed, cfg, tokens=9, experts=16, top_k=4, n=384, k=6144, down=False)  # gate_up-like, 48 K blocks
    _run(seed + 1, cfg, tokens=5, experts=16, top_k=4, n=768, k=256, down=True)  # down-like, routed weights


def test_kernel_at_glm_slice_shapes():
    """GLM-5.1's TP-8 slices (gate_up K 6144 x N 512, down K 256 x N 6144), 256 experts, top-8."""
    seed = _seed()
    for cfg in (BlockConfig(16, 64), BlockConfig(64, 128)):
        _run(seed, cfg, tokens=3, experts=256, top_k=8, n=512, k=6144, down=False)
        _run(seed + 7, cfg, tokens=3, experts=256, top_k=8, n=6144, k=256, down=True)


def test_config_errors():
    with pytest.raises(ValueError, match="block_k"):
        BlockConfig(block_k=64)
    with pytest.raises(ValueError, match="block_m"):
        BlockConfig(block_m=24)
