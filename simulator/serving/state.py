"""What the serving model tracks: which system runs, each request's progress and slots, and each
scheduler's queues and pool."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import simpy

from .admission import Seq
from .pool import RankPool


class System(StrEnum):
    BASELINE = "baseline"  # every token's KV in HBM
    HISPARSE = "hisparse"  # hot buffers in HBM, the full KV in the host pool


@dataclass
class Request:
    rid: int
    input_tokens: int
    output_tokens: int
    profile: int
    arrival: float
    slots_device: int = 0  # device KV slots held (page-granular)
    slots_host: int = 0  # HiSparse logical/host slots held (page-granular)
    prefilled: int = 0  # tokens of the current prefill done
    target: int = 0  # tokens the current prefill covers: the prompt, plus the generated ones after a retraction
    generated: int = 0  # output tokens so far (the first comes with the prefill's last chunk)
    retractions: int = 0
    buffer_since: int = 0  # decode steps done when its hot buffer was last set up (the trace restarts there)
    resident_tokens: int = 0  # dynamic residency: KV positions held on the device (serving/residency.py)
    hot: bool = True  # dynamic residency: holds a hot buffer (swap mode, or partly spilled); False: wholly resident
    demotions: int = 0  # dynamic residency: times it was demoted to swap mode (or first spilled)
    first_token: float = math.nan
    admitted: float = math.nan
    finish: float = math.nan
    done: simpy.Event | None = None

    @property
    def seq(self) -> Seq:
        """The request as SGLang's admission arithmetic sees it."""
        return Seq(self.output_tokens, self.generated, self.input_tokens)  # max_new, out, prompt

    @property
    def context(self) -> int:
        """Tokens of context at its next decode step (prompt plus every output token so far)."""
        return self.input_tokens + self.generated


@dataclass
class Rank:
    """One scheduler's queues, pool and admission state."""

    pool: RankPool
    ratio: float  # SGLang's new_token_ratio of this scheduler
    waiting: list[Request] = field(default_factory=list)
    prefilling: list[Request] = field(default_factory=list)  # the chunked request (at most one) mid-prefill
    running: list[Request] = field(default_factory=list)
    retracted: list[Request] = field(default_factory=list)  # pd-decode: KV offloaded to host, resumed first
    batch_is_full: bool = False  # SGLang's running_batch.batch_is_full: no admission until a request leaves
    gap_carry: float = 0.0  # time its running requests waited on its own prefill since their last token
