"""The SGLang launch command of a planned configuration: the flags that lay the deployment out as
the serving model simulated it, and HiSparse's ``--hisparse-config`` JSON.

Flag spellings are SGLang's ``server_args.py`` (``--model-path``, ``--tp-size``, ``--dp-size``,
``--enable-dp-attention``, ``--ep-size``, ``--moe-a2a-backend``, ``--mem-fraction-static``,
``--max-running-requests``, ``--max-total-tokens``, ``--chunked-prefill-size``,
``--kv-cache-dtype``, ``--schedule-conservativeness``, ``--disable-radix-cache``,
``--disaggregation-mode``, ``--enable-hisparse``, ``--hisparse-config``); the blog's commands use
the same ones. Only values the deployment file sets are passed: a 0 (derived) is left to SGLang,
which derives it as the model does.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from .specs import (
    Attention,
    DeploymentSpec,
    HiSparseSpec,
    Mode,
    ModelSpec,
    MoeA2ABackend,
    MoeLayout,
)

# Hugging Face repositories of the shipped model presets (the checkpoints their config.json shapes
# are read from); a model file of the user's gets a placeholder to fill in.
MODEL_PATHS = {"glm-5.1-fp8": "zai-org/GLM-5.1-FP8", "deepseek-v3.2-fp8": "deepseek-ai/DeepSeek-V3.2",
               "glm-5.2-fp8": "zai-org/GLM-5.2-FP8", "deepseek-v4-flash": "deepseek-ai/DeepSeek-V4-Flash",
               "deepseek-v4-pro": "deepseek-ai/DeepSeek-V4-Pro"}


def model_path(model: ModelSpec) -> str:
    base = model.name.removesuffix("-kvfp8")
    return MODEL_PATHS.get(base, f"<path of the {model.name} checkpoint>")


def kv_cache_dtype(model: ModelSpec) -> str:
    """SGLang's ``--kv-cache-dtype`` for the model's MLA row: 2 bytes per element is bfloat16, the
    656 B row (512 e4m3 + 4 fp32 scales + 64 bf16 rope) fp8_e4m3."""
    if model.kv_row_bytes == 2 * (model.kv_lora_rank + model.qk_rope_head_dim):
        return "bfloat16"
    return "fp8_e4m3"


def hisparse_config(hs: HiSparseSpec) -> dict[str, Any]:
    """``--hisparse-config``: the keys SGLang reads (``swap_in_block_size`` left at its default)."""
    ratio = hs.host_to_device_ratio
    return {"top_k": hs.top_k, "device_buffer_size": hs.device_buffer_size,
            "host_to_device_ratio": int(ratio) if float(ratio).is_integer() else ratio}


@dataclass(frozen=True)
class Launch:
    system: str
    argv: tuple[str, ...]
    hisparse_config: dict[str, Any] | None
    instances: int
    notes: tuple[str, ...] = field(default=())
    env: tuple[tuple[str, str], ...] = ()  # the server's environment the plan assumed (KEY, VALUE)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def as_dict(self) -> dict[str, Any]:
        return {"system": self.system, "command": self.command, "argv": list(self.argv),
                "hisparse_config": self.hisparse_config, "instances": self.instances, "notes": list(self.notes),
                "env": dict(self.env)}


def launch_script(launch: dict[str, Any], header: str) -> str:
    """``launch.sh`` of a launch (``Launch.as_dict``): the environment the plan assumed exported before the
    command, each note a comment (the script held the command alone: a plan with the IndexShare prefetch off
    launched a server with it on)."""
    lines = ["#!/bin/sh", f"# {header}"]
    lines += [f"# note: {n}" for n in launch.get("notes", ())]
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in launch.get("env", {}).items()]
    return "\n".join([*lines, launch["command"]]) + "\n"


def launch_command(model: ModelSpec, dep: DeploymentSpec, hs: HiSparseSpec | None, *,
                   gpus_per_node: int = 8) -> Launch:
    """The launch command of one instance (``dep.instances`` of them serve the deployment)."""
    a = ["python", "-m", "sglang.launch_server", "--model-path", model_path(model), "--tp-size", str(dep.tp)]
    notes = []
    env: list[tuple[str, str]] = []
    if dep.attention == Attention.DP:
        a += ["--dp-size", str(dep.dp), "--enable-dp-attention"]
    if dep.moe == MoeLayout.EP:
        a += ["--ep-size", str(dep.tp)]
        if dep.a2a_backend == MoeA2ABackend.DEEPEP:
            a += ["--moe-a2a-backend", "deepep"]
    a += ["--mem-fraction-static", f"{dep.mem_fraction_static:g}"]
    if dep.max_running_requests:
        a += ["--max-running-requests", str(dep.max_running_requests)]
    if dep.max_total_tokens:
        a += ["--max-total-tokens", str(dep.max_total_tokens)]
    # the deployment file holds the per-rank chunk (SGLang divides the flag by dp under DP attention)
    chunk = dep.prefill_chunk_tokens * (dep.dp if dep.attention == Attention.DP else 1)
    a += ["--chunked-prefill-size", str(chunk), "--kv-cache-dtype", kv_cache_dtype(model)]
    if dep.schedule_conservativeness != 1.0:
        a += ["--schedule-conservativeness", f"{dep.schedule_conservativeness:g}"]
    if dep.page_size != 64:
        a += ["--page-size", str(dep.page_size)]
    if not dep.radix_cache or hs is not None:
        a += ["--disable-radix-cache"]  # the blog's runs; HiSparse requires it
    if dep.mode == Mode.PD_DECODE:
        a += ["--disaggregation-mode", "decode"]
        notes.append("decode node only: the prefill node runs the same model with --disaggregation-mode prefill")
        if dep.kv_transfer.value != "none":
            notes.append(f"KV transfer {dep.kv_transfer.value} over RDMA: --disaggregation-transfer-backend mooncake "
                         "(or nixl) on both sides")
    cfg = None
    if hs is not None:
        cfg = hisparse_config(hs)
        a += ["--enable-hisparse", "--hisparse-config", json.dumps(cfg, separators=(",", ":"))]
        if hs.policy != "lru":
            notes.append(f"policy {hs.policy!r} is simulated only: SGLang's HiSparse evicts LRU")
        if hs.residency == "sglang-dynamic":
            notes.append("residency sglang-dynamic: SGLang's dynamic HiSparse residency (PRs #23935, #30266, open "
                         "when read): a build with those PRs; released SGLang runs swap mode")
        elif hs.residency == "vllm-spill":
            notes.append("residency vllm-spill: vLLM's HiSparse (PRs #49629, #51323, #53781); this SGLang command "
                         "runs swap mode, serve it with vLLM")
        if not hs.prefetch and model.shared_layers:
            notes.append("IndexShare prefetch off: set SGLANG_DISABLE_HISPARSE_PREFETCH=1 in the server's environment")
            env.append(("SGLANG_DISABLE_HISPARSE_PREFETCH", "1"))
    if dep.tp > gpus_per_node:
        nodes = dep.tp // gpus_per_node
        a += ["--nnodes", str(nodes), "--node-rank", "0", "--dist-init-addr", "<head-node-ip>:5000"]
        notes.append(f"one instance spans {nodes} nodes: run it on each with --node-rank 0..{nodes - 1}")
    if dep.instances > 1:
        notes.append(f"{dep.instances} instances of {dep.tp} GPUs each, behind a router (sglang_router)")
    if dep.pool_profile.value == "before-31992":
        notes.append("pool_profile before-31992: the memory profile of SGLang releases before PR #31992")
    return Launch("hisparse" if hs is not None else "baseline", tuple(a), cfg, dep.instances, tuple(notes), tuple(env))


def launch_for(scenario, row: dict | None) -> Launch | None:
    """The launch command of a plan row (its system and HiSparse knobs), or None for no row."""
    import dataclasses

    if row is None:
        return None
    hs = None
    if row["system"] == "hisparse":
        hs = dataclasses.replace(scenario.hisparse, device_buffer_size=int(row["device_buffer_size"]),
                                 host_to_device_ratio=float(row["host_to_device_ratio"]),
                                 residency=row.get("residency") or scenario.hisparse.residency)
    lc = launch_command(scenario.model, scenario.deployment, hs, gpus_per_node=scenario.gpu.gpus_per_node)
    spec = getattr(scenario, "speculative", None)
    if spec is None or row.get("speculative", "off") == "off":
        return lc
    # speculative decoding: SGLang's flags, and the acceptance the plan assumed (a benchmark pins it so)
    flags = tuple(a for f in spec.launch_flags() for a in f.split())
    note = (f"speculative decoding planned at {spec.describe()}; a benchmark pins it with "
            f"SGLANG_SIMULATE_ACC_LEN={spec.accept_len:g} SGLANG_SIMULATE_ACC_METHOD={spec.accept_method.value}"
            if spec.accept_method.value != "distribution" else f"speculative decoding planned at {spec.describe()}")
    return dataclasses.replace(lc, argv=lc.argv + flags, notes=lc.notes + (note,))
