"""A minimal PyTorch decoder for the two architectures the recorder runs (Llama, Gemma-3).

Only what the recorder needs: chunked prefill into a preallocated KV cache, one-token decode,
and, for the layers being recorded, the newest query's attention probabilities averaged over
heads. Float32 on the CPU; the same inputs give the same outputs bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import HisparseError
from .weights import GGUFModel


@dataclass(frozen=True)
class ModelConfig:
    arch: str  # "llama" or "gemma3"
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ctx_max: int
    norm_eps: float
    rope_base: float
    rope_base_local: float  # sliding-window layers (Gemma-3)
    sliding_window: int  # 0: every layer attends to the whole context
    global_layers: tuple[int, ...]  # layers attending to the whole context
    bos: int | None

    @staticmethod
    def from_gguf(g: GGUFModel) -> ModelConfig:
        """The config a GGUF file's metadata gives; HisparseError naming the key that is missing
        or not a number (a file without one raised KeyError, a traceback)."""
        if g.arch not in ("llama", "gemma3"):
            raise HisparseError(f"{g.path}: architecture {g.arch!r} is not supported (llama, gemma3 are)")
        try:
            cfg = ModelConfig._from_meta(g)
        except KeyError as exc:
            raise HisparseError(f"{g.path}: GGUF metadata {exc.args[0]!r} is missing (not a complete "
                                f"{g.arch} model)") from None
        except (TypeError, ValueError) as exc:
            raise HisparseError(f"{g.path}: GGUF metadata is not what a {g.arch} model holds ({exc})") from None
        for name, v in (("block_count", cfg.layers), ("embedding_length", cfg.hidden),
                        ("attention.head_count", cfg.heads), ("attention.head_count_kv", cfg.kv_heads),
                        ("attention.key_length", cfg.head_dim), ("feed_forward_length", cfg.ffn),
                        ("context_length", cfg.ctx_max), ("tokens", cfg.vocab)):
            if v < 1:
                raise HisparseError(f"{g.path}: GGUF metadata {name} = {v}, needs a positive number")
        if cfg.heads % cfg.kv_heads:
            raise HisparseError(f"{g.path}: GGUF metadata: {cfg.heads} attention heads are not a multiple of "
                                f"{cfg.kv_heads} key/value heads")
        return cfg

    @staticmethod
    def _from_meta(g: GGUFModel) -> ModelConfig:
        m, a = g.meta, g.arch
        layers = int(m[f"{a}.block_count"])
        heads = int(m[f"{a}.attention.head_count"])
        hidden = int(m[f"{a}.embedding_length"])
        window = int(m.get(f"{a}.attention.sliding_window") or 0) if a == "gemma3" else 0
        # Gemma-3: five sliding-window layers, then one global layer (llama.cpp's swa pattern 6).
        global_layers = tuple(i for i in range(layers) if not window or i % 6 == 5)
        bos = m.get("tokenizer.ggml.bos_token_id") if m.get("tokenizer.ggml.add_bos_token") else None
        return ModelConfig(
            arch=a, layers=layers, hidden=hidden, ffn=int(m[f"{a}.feed_forward_length"]), heads=heads,
            kv_heads=int(m.get(f"{a}.attention.head_count_kv") or heads),
            head_dim=int(m.get(f"{a}.attention.key_length") or hidden // heads),
            vocab=len(m["tokenizer.ggml.tokens"]), ctx_max=int(m[f"{a}.context_length"]),
            norm_eps=float(m[f"{a}.attention.layer_norm_rms_epsilon"]),
            rope_base=float(m.get(f"{a}.rope.freq_base") or 10000.0),
            rope_base_local=10000.0, sliding_window=window, global_layers=global_layers,
            bos=None if bos is None else int(bos))


def _check_tensors(g: GGUFModel, cfg: ModelConfig) -> None:
    """Every tensor the forward pass reads is there, at the shape the config gives: a file
    without one raised KeyError, one of another shape a matmul's RuntimeError, mid-run."""
    q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    want = {"token_embd.weight": (cfg.vocab, cfg.hidden), "output_norm.weight": (cfg.hidden,)}
    if "output.weight" in g.tensors:
        want["output.weight"] = (cfg.vocab, cfg.hidden)
    block = {"attn_norm": (cfg.hidden,), "attn_q": (q, cfg.hidden), "attn_k": (kv, cfg.hidden),
             "attn_v": (kv, cfg.hidden), "attn_output": (cfg.hidden, q), "ffn_norm": (cfg.hidden,),
             "ffn_gate": (cfg.ffn, cfg.hidden), "ffn_up": (cfg.ffn, cfg.hidden), "ffn_down": (cfg.hidden, cfg.ffn)}
    if cfg.arch == "gemma3":
        block |= {"attn_q_norm": (cfg.head_dim,), "attn_k_norm": (cfg.head_dim,),
                  "post_attention_norm": (cfg.hidden,), "post_ffw_norm": (cfg.hidden,)}
    for i in range(cfg.layers):
        want |= {f"blk.{i}.{name}.weight": shape for name, shape in block.items()}
    for name, shape in want.items():
        have = g.tensors.get(name)
        if have is None:
            raise HisparseError(f"{g.path}: tensor {name} is missing (not a complete {cfg.arch} model)")
        if tuple(have.shape) != shape:
            raise HisparseError(f"{g.path}: tensor {name} has shape {tuple(have.shape)}, its metadata gives "
                                f"{shape}")


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # GGUF stores Gemma's norm weights with the +1 already added: both archs multiply by w.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class Model:
    """Weights, a KV cache of ``capacity`` tokens, and the forward pass."""

    def __init__(self, g: GGUFModel, capacity: int) -> None:
        self.cfg = cfg = ModelConfig.from_gguf(g)
        if capacity > cfg.ctx_max:
            raise HisparseError(f"prompt + steps = {capacity} tokens, more than the model's context "
                                f"{cfg.ctx_max}")
        self.capacity = capacity
        _check_tensors(g, cfg)
        t = {name: torch.from_numpy(np.require(a, requirements="W")) for name, a in g.tensors.items()}
        self.embed = t["token_embd.weight"]
        self.out = t.get("output.weight", self.embed)  # tied embeddings when absent
        self.out_norm = t["output_norm.weight"]
        self.w = [{k.split(".", 2)[2].removesuffix(".weight"): v for k, v in t.items()
                   if k.startswith(f"blk.{i}.")} for i in range(cfg.layers)]
        shape = (cfg.layers, cfg.kv_heads, capacity, cfg.head_dim)
        self.k_cache = torch.zeros(shape)
        self.v_cache = torch.zeros(shape)
        self.length = 0  # tokens in the cache
        self._inv_freq = {base: 1.0 / base ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
                          for base in (cfg.rope_base, cfg.rope_base_local)}

    # -- pieces ---------------------------------------------------------------------------
    def _rope(self, x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
        """Rotary embedding; x is [n, heads, dim]. GGUF's llama Q/K rows are permuted for
        adjacent-pair rotation; Gemma keeps HF's rotate-half (NeoX) layout."""
        ang = (pos.to(torch.float64)[:, None] * self._inv_freq[base][None, :])
        cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
        if self.cfg.arch == "llama":
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    def _attention(self, i: int, x: torch.Tensor, start: int, want_probs: bool):
        cfg, w = self.cfg, self.w[i]
        n = x.shape[0]
        q = (x @ w["attn_q"].T).view(n, cfg.heads, cfg.head_dim)
        k = (x @ w["attn_k"].T).view(n, cfg.kv_heads, cfg.head_dim)
        v = (x @ w["attn_v"].T).view(n, cfg.kv_heads, cfg.head_dim)
        if cfg.arch == "gemma3":
            q, k = _rms(q, w["attn_q_norm"], cfg.norm_eps), _rms(k, w["attn_k_norm"], cfg.norm_eps)
        is_global = i in cfg.global_layers
        base = cfg.rope_base if is_global else cfg.rope_base_local
        pos = torch.arange(start, start + n)
        q, k = self._rope(q, pos, base), self._rope(k, pos, base)
        end = start + n
        self.k_cache[i, :, start:end] = k.transpose(0, 1)
        self.v_cache[i, :, start:end] = v.transpose(0, 1)
        lo = 0 if is_global else max(0, start - cfg.sliding_window + 1)
        keys, vals = self.k_cache[i, :, lo:end], self.v_cache[i, :, lo:end]  # [kv, T, d]
        group = cfg.heads // cfg.kv_heads
        # [kv, g*n, d] @ [kv, d, T]: plain batched matmuls (a broadcast matmul copies the cache)
        qg = q.view(n, cfg.kv_heads, group, cfg.head_dim).permute(1, 2, 0, 3).reshape(cfg.kv_heads, group * n, cfg.head_dim)
        scores = torch.bmm(qg, keys.transpose(1, 2)).view(cfg.kv_heads, group, n, -1) / math.sqrt(cfg.head_dim)
        kpos = torch.arange(lo, end)
        masked = kpos[None, :] > pos[:, None]
        if not is_global:
            masked |= kpos[None, :] <= pos[:, None] - cfg.sliding_window
        if masked.any():
            scores.masked_fill_(masked, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.bmm(probs.view(cfg.kv_heads, group * n, -1), vals).view(cfg.kv_heads, group, n, cfg.head_dim)
        out = out.permute(2, 0, 1, 3).reshape(n, cfg.heads * cfg.head_dim)
        newest = probs[:, :, -1, :].mean(dim=(0, 1)) if want_probs else None  # over all heads
        return out @ w["attn_output"].T, newest

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        w = self.w[i]
        gate = x @ w["ffn_gate"].T
        act = F.gelu(gate, approximate="tanh") if self.cfg.arch == "gemma3" else F.silu(gate)
        return (act * (x @ w["ffn_up"].T)) @ w["ffn_down"].T

    # -- forward ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: list[int], *, record: tuple[int, ...] = (), logits: bool = False):
        """Append ``tokens`` to the cache. Returns (logits of the last token or None,
        {layer: head-averaged attention probabilities of the last token over [0, length)})."""
        cfg = self.cfg
        n, start = len(tokens), self.length
        if start + n > self.capacity:
            raise HisparseError(f"KV cache full ({self.capacity} tokens)")
        h = self.embed[torch.tensor(tokens, dtype=torch.long)]
        if cfg.arch == "gemma3":
            h = h * torch.tensor(math.sqrt(cfg.hidden), dtype=h.dtype)
        probs: dict[int, torch.Tensor] = {}
        for i in range(cfg.layers):
            w = self.w[i]
            a, p = self._attention(i, _rms(h, w["attn_norm"], cfg.norm_eps), start, i in record)
            if cfg.arch == "gemma3":
                a = _rms(a, w["post_attention_norm"], cfg.norm_eps)
            h = h + a
            m = self._mlp(i, _rms(h, w["ffn_norm"], cfg.norm_eps))
            if cfg.arch == "gemma3":
                m = _rms(m, w["post_ffw_norm"], cfg.norm_eps)
            h = h + m
            if p is not None:
                probs[i] = p
        self.length = start + n
        out = None
        if logits:
            out = _rms(h[-1], self.out_norm, cfg.norm_eps) @ self.out.T
        return out, probs

    # -- checkpoints --------------------------------------------------------------------------
    def cache_state(self) -> dict[str, torch.Tensor]:
        return {"k": self.k_cache[:, :, : self.length].clone(), "v": self.v_cache[:, :, : self.length].clone()}

    def load_cache_state(self, state: dict[str, torch.Tensor]) -> None:
        n = state["k"].shape[2]
        self.k_cache[:, :, :n] = state["k"]
        self.v_cache[:, :, :n] = state["v"]
        self.length = n


def topk_rows(probs: torch.Tensor, ks: tuple[int, ...]) -> dict[int, np.ndarray]:
    """For each k, the positions of the k largest probabilities, sorted ascending.

    Ties break towards the lower position (a stable descending sort), so the result does not
    depend on the sort algorithm; all positions when the context holds at most k."""
    order = torch.sort(probs, descending=True, stable=True).indices.numpy()
    return {k: np.sort(order[:k]).astype(np.int32) for k in ks}
