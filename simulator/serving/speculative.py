"""Speculative decoding (EAGLE / MTP) as SGLang runs it: the spec, and the tokens each step accepts.

Read from sgl-project/sglang (``python/sglang/srt/speculative/eagle_worker.py``, ``spec_utils.py``,
``model_executor/model_runner.py``, ``server_args.py``); written here from that reading:

- A decode iteration of a request (topk 1, a chain): the draft model (GLM's one MTP / NextN layer,
  its own attention, indexer, MoE and KV, the target's embedding and lm_head) runs ``num_steps``
  passes: one *draft extend* over the tokens the last verify accepted (its CUDA graph is captured
  at ``num_draft_tokens`` tokens per request) and ``num_steps - 1`` one-token passes; then the
  target model runs one *verify* pass (``ForwardMode.TARGET_VERIFY``) over ``num_draft_tokens`` =
  1 + ``num_steps`` query positions per request (the last accepted token and the drafts).
- The step keeps the longest accepted prefix plus the target's own next token: 1 to
  ``num_steps + 1`` tokens ("accept length", what ``SGLANG_SIMULATE_ACC_LEN`` pins).
- ``SGLANG_SIMULATE_ACC_LEN`` (``spec_utils._generate_simulated_accept_index``): one accept length
  per verify call for the whole batch; ``SGLANG_SIMULATE_ACC_METHOD`` ``multinomial`` (the default):
  round(clamp(N(mean, 1), 1, num_steps + 1)); ``match-expected``: floor or ceil of the mean, drawn
  with the weights that make the mean exact.
- Memory (``model_runner.py``): the target's token pool gets a headroom of
  ``max_num_reqs x (num_steps x topk + num_draft_tokens) + 100`` slots on top of its profile, and
  the draft worker a KV pool of the same size for its own layers, both after the target's budget
  (out of the ``1 - mem_fraction_static`` slack, as the draft weights are). With speculative
  decoding and no ``--max-running-requests``, SGLang caps the server at 48 running requests
  (``server_args.py``, ``_handle_speculative_decoding``; the GLM-5.2 cookbook, PR #28731: "spec
  defaults to 48").
- HiSparse (SGLang PR #32162, the multi-step swap kernel; #23239 -> #25584 -> #26445 and #37771,
  the integration): every verify position's top-k is planned in one gather/commit call per layer
  that flattens [batch, steps, top_k], dedupes misses across the positions and commits into a CLOCK
  cache (``replay/policies/sglang_clock.py``); the draft tokens' KV is written into the request's
  extra page (the reserved page beyond the hot buffer), and the draft layer's KV stays on the GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from ..errors import HisparseError

# SGLang server_args: with speculative decoding and no --max-running-requests, 48 for the server
SPEC_DEFAULT_MAX_RUNNING = 48


class Algorithm(StrEnum):
    """``--speculative-algorithm``: EAGLE (GLM's MTP layer as the draft, SGLang folded NEXTN into it)."""

    EAGLE = "eagle"
    MTP = "mtp"  # the same mechanism under SGLang's older name (NEXTN / MTP): the model's own MTP layer


class AcceptMethod(StrEnum):
    """How each step's accept length is drawn around ``accept_len`` (``SGLANG_SIMULATE_ACC_METHOD``)."""

    MULTINOMIAL = "multinomial"  # SGLang's default: round(clamp(N(mean, 1), 1, steps + 1))
    MATCH_EXPECTED = "match-expected"  # floor or ceil of the mean, the mean exact
    DISTRIBUTION = "distribution"  # accept_probs: P(accept length = 1 .. steps + 1)


@dataclass(frozen=True)
class SpeculativeSpec:
    """``--speculative-algorithm --speculative-num-steps --speculative-eagle-topk
    --speculative-num-draft-tokens`` (SGLang's "5-1-6") and the acceptance the run sees."""

    algorithm: Algorithm = Algorithm.EAGLE
    num_steps: int = 1
    eagle_topk: int = 1
    num_draft_tokens: int = 2
    accept_len: float = 1.0  # mean tokens a step keeps (SGLANG_SIMULATE_ACC_LEN); ignored with accept_probs
    accept_method: AcceptMethod = AcceptMethod.MULTINOMIAL
    accept_probs: tuple[float, ...] = ()  # DISTRIBUTION: P(1), ..., P(num_steps + 1)
    draft_layers: int = 1  # the draft model's decoder layers (GLM-5.x: one MTP layer, num_nextn_predict_layers)
    where: str = field(default="<speculative>", compare=False)

    def __post_init__(self) -> None:
        w = self.where
        try:
            object.__setattr__(self, "algorithm", Algorithm(str(self.algorithm).lower()))
            object.__setattr__(self, "accept_method", AcceptMethod(self.accept_method))
        except ValueError as exc:
            raise HisparseError(f"{w}: {exc} (algorithm: {', '.join(Algorithm)}; accept_method: "
                                f"{', '.join(AcceptMethod)})") from None
        for name in ("num_steps", "eagle_topk", "num_draft_tokens", "draft_layers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise HisparseError(f"{w}: {name} = {v!r} must be a whole number >= 1")
        if self.eagle_topk != 1:
            raise HisparseError(f"{w}: eagle_topk = {self.eagle_topk}: only chains (topk 1) are modelled (the "
                                "cookbook's recipes, and HiSparse's multi-step path, run topk 1)")
        if self.num_draft_tokens != self.num_steps + 1:
            raise HisparseError(f"{w}: num_draft_tokens = {self.num_draft_tokens} with topk 1 must be num_steps + 1 "
                                f"= {self.num_steps + 1} (SGLang sets it so for a chain)")
        top = self.num_steps + 1
        if self.accept_method is AcceptMethod.DISTRIBUTION:
            if not isinstance(self.accept_probs, (list, tuple)) or not all(map(_is_number, self.accept_probs)):
                raise HisparseError(f"{w}: accept_probs = {self.accept_probs!r} must be a list of {top} numbers "
                                    f"(P(accept length = 1), ..., P({top}))")
            probs = tuple(float(p) for p in self.accept_probs)
            if len(probs) != top or any(not (p >= 0) or not math.isfinite(p) for p in probs) or abs(sum(probs) - 1) > 1e-6:
                raise HisparseError(f"{w}: accept_probs must be {top} probabilities (accept lengths 1..{top}) "
                                    f"summing to 1, got {list(self.accept_probs)}")
            object.__setattr__(self, "accept_probs", probs)
            object.__setattr__(self, "accept_len", float(np.dot(np.arange(1, top + 1), probs)))
        else:
            a = self.accept_len
            if not _is_number(a) or not math.isfinite(a) or not 1 <= a <= top:
                raise HisparseError(f"{w}: accept_len = {a!r} must be between 1 and num_steps + 1 = {top}")
            object.__setattr__(self, "accept_len", float(a))

    @property
    def label(self) -> str:
        return f"{self.algorithm.value} {self.num_steps}-{self.eagle_topk}-{self.num_draft_tokens}"

    @property
    def verify_tokens(self) -> int:
        """Query positions per request in the verify pass: the last accepted token and the drafts."""
        return self.num_draft_tokens

    def pmf(self) -> np.ndarray:
        """P(accept length = 1 .. num_steps + 1) of one step."""
        top = self.num_steps + 1
        if self.accept_method is AcceptMethod.DISTRIBUTION:
            return np.asarray(self.accept_probs, dtype=float)
        out = np.zeros(top)
        if self.accept_method is AcceptMethod.MATCH_EXPECTED:
            lo = int(self.accept_len // 1)
            if lo >= top:
                out[top - 1] = 1.0
            else:
                out[lo - 1] = 1.0 - (self.accept_len - lo)
                out[lo] += self.accept_len - lo
            return out
        # multinomial: round(clamp(x, 1, top)), x ~ N(mean, 1); torch rounds half to even
        from math import erf, sqrt

        cdf = lambda x: 0.5 * (1 + erf((x - self.accept_len) / sqrt(2)))  # noqa: E731
        for n in range(1, top + 1):
            lo = -math.inf if n == 1 else n - 0.5
            hi = math.inf if n == top else n + 0.5
            out[n - 1] = cdf(hi) - cdf(lo)
        return out

    @property
    def mean_accept(self) -> float:
        """The mean accept length the draws give (multinomial's clamp moves it off ``accept_len``)."""
        return float(np.dot(np.arange(1, self.num_steps + 2), self.pmf()))

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Accept lengths of ``n`` consecutive steps (one per verify call: SGLang applies one draw to
        the whole batch)."""
        return rng.choice(np.arange(1, self.num_steps + 2), size=n, p=self.pmf())

    def describe(self) -> str:
        how = {AcceptMethod.MULTINOMIAL: f"SGLANG_SIMULATE_ACC_LEN={self.accept_len:g} (multinomial: mean "
                                         f"{self.mean_accept:.3g} after the clamp to 1..{self.num_steps + 1})",
               AcceptMethod.MATCH_EXPECTED: f"SGLANG_SIMULATE_ACC_LEN={self.accept_len:g} (match-expected)",
               AcceptMethod.DISTRIBUTION: f"accept lengths drawn from {list(self.accept_probs)} (mean "
                                          f"{self.accept_len:.3g})"}[self.accept_method]
        return (f"speculative decoding {self.label}: {self.num_steps} draft pass(es) of the {self.draft_layers}-layer "
                f"draft, one verify pass over {self.verify_tokens} positions per request; {how}")

    def launch_flags(self) -> list[str]:
        return ["--speculative-algorithm EAGLE", f"--speculative-num-steps {self.num_steps}",
                f"--speculative-eagle-topk {self.eagle_topk}", f"--speculative-num-draft-tokens {self.num_draft_tokens}"]


def _is_number(v: object) -> bool:
    """A TOML number (a bool is an int to Python, not a number here)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_SPEC_RE = re.compile(r"^\s*(eagle|mtp|nextn)\s*:\s*(\d+)-(\d+)-(\d+)\s*$", re.IGNORECASE)


def parse_speculative(text: str, accept_len: float | None = None, method: str | None = None,
                      accept_probs: tuple[float, ...] = (), where: str = "--speculative") -> SpeculativeSpec:
    """``eagle:5-1-6`` (algorithm:steps-topk-draft tokens) and the acceptance -> a spec; or a TOML
    file with a ``[speculative]`` table (``from_table``'s keys; the options, when given, replace its
    acceptance); a clear error naming the option otherwise."""
    if str(text).endswith(".toml"):
        from pathlib import Path

        from .. import inputs

        path = Path(text)
        if not path.exists() and not path.is_symlink():  # a folder or a FIFO: read_toml says what it is
            raise HisparseError(f"{where} {text}: no such file")
        data = inputs.read_toml(path)
        table = data.get("speculative", data)
        if not isinstance(table, dict):
            raise HisparseError(f"{text}: [speculative] must be a table")
        table = dict(table)
        if accept_probs:
            table.update(accept_probs=list(accept_probs), accept_method=AcceptMethod.DISTRIBUTION.value)
            table.pop("accept_len", None)
        elif accept_len is not None:
            table["accept_len"] = accept_len
            table.pop("accept_probs", None)
            table["accept_method"] = method or table.get("accept_method", AcceptMethod.MULTINOMIAL.value)
            if table["accept_method"] == AcceptMethod.DISTRIBUTION.value:
                table["accept_method"] = AcceptMethod.MULTINOMIAL.value
        elif method is not None:  # --accept-method alone: how the file's accept_len is drawn (was dropped)
            if "accept_probs" in table:
                raise HisparseError(f"--accept-method {method}: {text} gives accept_probs (a distribution, drawn as "
                                    "given); --accept-method applies to an accept_len")
            table["accept_method"] = method
        return from_table(table, f"{text}: [speculative]")
    m = _SPEC_RE.match(str(text))
    if not m:
        raise HisparseError(f"{where} {text!r}: expected ALGORITHM:STEPS-TOPK-DRAFT, e.g. eagle:5-1-6 or mtp:1-1-2")
    algo = "mtp" if m.group(1).lower() in ("mtp", "nextn") else "eagle"
    steps, topk, draft = (int(m.group(i)) for i in (2, 3, 4))
    if accept_probs:
        method = AcceptMethod.DISTRIBUTION.value
    elif accept_len is None:
        raise HisparseError(f"{where} {text}: give the acceptance: --accept-len MEAN (SGLANG_SIMULATE_ACC_LEN) or "
                            "--accept-probs P1,P2,...")
    return SpeculativeSpec(algo, steps, topk, draft, float(accept_len or 1.0),
                           method or AcceptMethod.MULTINOMIAL.value, tuple(accept_probs), where=where)


def from_table(data: dict, where: str) -> SpeculativeSpec:
    """A ``[speculative]`` table (a published set's scenario, a user's file): keys ``speculative``
    (``eagle:5-1-6``) or ``num_steps`` / ``eagle_topk`` / ``num_draft_tokens``, ``accept_len``,
    ``accept_method``, ``accept_probs``, ``algorithm``."""
    known = {"speculative", "algorithm", "num_steps", "eagle_topk", "num_draft_tokens", "accept_len", "accept_method",
             "accept_probs", "draft_layers"}
    bad = sorted(set(data) - known)
    if bad:
        raise HisparseError(f"{where}: unknown key(s) {', '.join(bad)} (known: {', '.join(sorted(known))})")
    d = dict(data)
    if "accept_len" in d and not _is_number(d["accept_len"]):
        raise HisparseError(f"{where}: accept_len = {d['accept_len']!r} must be a number (SGLANG_SIMULATE_ACC_LEN)")
    if "accept_probs" in d and (not isinstance(d["accept_probs"], (list, tuple))
                                or not all(map(_is_number, d["accept_probs"]))):
        raise HisparseError(f"{where}: accept_probs = {d['accept_probs']!r} must be a list of numbers "
                            "(P(accept length = 1), P(2), ...)")
    if "accept_len" not in d and "accept_probs" not in d:  # as --speculative without --accept-len (ran at 1)
        raise HisparseError(f"{where}: give the acceptance: accept_len (SGLANG_SIMULATE_ACC_LEN) or accept_probs")
    if "speculative" in d:
        base = parse_speculative(d.pop("speculative"), d.get("accept_len", 1.0), d.get("accept_method"),
                                 tuple(d.get("accept_probs", ())), where=where)
        d = {"algorithm": base.algorithm, "num_steps": base.num_steps, "eagle_topk": base.eagle_topk,
             "num_draft_tokens": base.num_draft_tokens} | d
    if "accept_probs" in d:
        d["accept_probs"] = tuple(d["accept_probs"])
        d.setdefault("accept_method", AcceptMethod.DISTRIBUTION.value)
    try:
        return SpeculativeSpec(**d, where=where)
    except TypeError as exc:
        raise HisparseError(f"{where}: {exc}") from None
