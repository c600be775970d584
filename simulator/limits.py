"""Work budgets: what one command may be asked to do, estimated from its inputs before any work.

Each budget has a default that the shipped scenarios stay far below and an environment variable
that raises it; a command over budget is a user error naming the inputs that set its size, the
estimate, the limit and how to raise it. (Read-size budgets of the input formats are in
``simulator/inputs.py``; a trace's chunk and stream budgets in ``simulator/trace/format.py``.)

- ``HISPARSE_MAX_POINTS`` (10,000): simulated points of one ``plan`` (load points x (baseline +
  one per HiSparse knob set)) or of one sweep grid (checked from its list lengths, before the
  cartesian product is built).
- ``HISPARSE_MAX_SIM_STEPS`` (10,000,000): work one ``plan`` is estimated to simulate (``plan_steps``:
  scheduler steps, with each simulated request, prompt chunk and trace replay counted at its cost in
  steps of ~15 us of CPU, an upper estimate), and one published set of ``plan --validate`` its points.
  The default plan with its search is ~2.9 million (7 s here on two workers); 10 million is at most
  ~2.5 minutes of CPU (``--concurrency 6000``, ~9 million: 47 s on two workers).
- ``HISPARSE_MAX_REPLAY_ACCESSES`` (10**11): accesses one ``replay`` (or a replay grid, per
  trace) replays: its configs x the trace's accesses. The bundled 78-layer trace holds 20 million.
- ``HISPARSE_MAX_TRACE_ENTRIES`` (2**32): top-k entries a ``trace gen`` or ``trace fit`` draws
  (requests x layers x steps x k, times the fit's draws). The bundled 78-layer preset is 20 million.
"""

from __future__ import annotations

from .errors import HisparseError
from .inputs import env_limit

BUDGETS = {"HISPARSE_MAX_POINTS": 10_000, "HISPARSE_MAX_SIM_STEPS": 10_000_000,
           "HISPARSE_MAX_TRACE_ENTRIES": 2**32, "HISPARSE_MAX_REPLAY_ACCESSES": 10**11}


def limit(env: str) -> int:
    """The budget ``env`` (its environment variable, else the default)."""
    return env_limit(env, BUDGETS[env])


def check(amount: int | float, env: str, what: str, *, unit: str, hint: str = "") -> None:
    """Refuse ``amount`` of work over the budget ``env``: one line with ``what`` set its size,
    the estimate, the limit and how to raise it."""
    most = limit(env)
    if amount > most:
        shown = f"{amount:,.0f}" if amount < 1e15 else f"{amount:.3g}"
        raise HisparseError(f"{what}: about {shown} {unit}, more than the limit of {most:,} "
                            f"({hint + ', or ' if hint else ''}set {env} to raise it)")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# What a simulated request costs beyond the scheduler steps, in steps of ~15 us of CPU (measured,
# 2026-12-07, process time of one baseline point at concurrency 256 on 8xH200 DP8, per request: 1 in / 2 out
# 0.13 ms, 32K / 2 0.53 ms, 1 / 8K 0.20 ms, 32K / 8K 1.45 ms, 128K / 8K 5.2 ms; 32K / 8K on a PD decode node
# 1.9 ms; HiSparse 1.1-1.35x the baseline; flat in the concurrency, so 10,000 clients are 40,000 requests and
# ~1 minute a system, which the scheduler steps alone, counting one wave of decode, put at 64,000 steps):
REQUEST_STEPS = 10  # its arrival, admission and finish (each finish ends a decode block)
CHUNK_STEPS = 25  # pricing one of its prompt chunks (the chunk's attention and indexer over its context): ~0.3 ms
OUTPUT_TOKENS_PER_STEP = 150  # its decode tokens, priced in its blocks' per-step vectors: ~0.1 us a token
REPLAY_ACCESSES_PER_STEP = 2_000  # a HiSparse knob set's trace replay (its miss profiles): ~170 million accesses/s


def plan_steps(*, ranks: int, instances: int, concurrency: int, rate: float, requests_per_client: int,
               input_tokens: int, output_tokens: int, length_jitter: float, prefill_chunk_tokens: int) -> int:
    """The work one simulated plan point takes, an upper estimate in scheduler steps (``model.InstanceSim.run``):
    each rank prefills its requests chunk by chunk and decodes every wave to its longest output, and
    every request of the simulated instance costs ``REQUEST_STEPS`` + ``CHUNK_STEPS`` a prompt chunk + its
    output over ``OUTPUT_TOKENS_PER_STEP`` (a point's time grows with its requests, not with its steps:
    clients beyond the pool wait, in more waves). Closed loop: each of the instance's clients
    (``concurrency / instances``) sends ``requests_per_client`` requests one after another; open loop:
    ``requests_per_client`` x 16 requests per rank."""
    longest_in = max(1, round(input_tokens * (1 + length_jitter)))
    longest_out = max(1, round(output_tokens * (1 + length_jitter)))
    chunks = ceil_div(longest_in, max(prefill_chunk_tokens, 1))
    if rate > 0:
        per_rank = requests_per_client * 16
        steps = per_rank * (chunks + longest_out)
        requests = per_rank * max(ranks, 1)
    else:
        clients = ceil_div(max(concurrency, 1), max(instances, 1))  # the simulated instance's (InstanceSim.clients)
        steps = requests_per_client * (ceil_div(clients, max(ranks, 1)) * chunks + longest_out)
        requests = requests_per_client * clients
    return steps + requests * (REQUEST_STEPS + CHUNK_STEPS * chunks + longest_out // OUTPUT_TOKENS_PER_STEP)


def replay_steps(replays: int, accesses: int) -> int:
    """``replays`` trace replays of ``accesses`` accesses each, in ``plan_steps``'s steps."""
    return replays * ceil_div(max(accesses, 0), REPLAY_ACCESSES_PER_STEP)


def available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), in bytes; None where unknown. Commands whose memory
    grows with an input's size (a context near 2**31 tokens) check it before any work."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


# Memory per context token of the trace commands that walk a whole context (measured peak RSS over a
# 50M-token .npy context, 2026-12-07: ``trace convert`` 16.9 B, the encoder's per-position state;
# ``trace compare`` 18.9 B, its per-position recency arrays; ``trace fit`` reads the trace as compare does
# before its draws, which ``trace.generator.check_shape`` checks on their own), rounded up: one figure for the three.
TRACE_BYTES_PER_TOKEN = 20


def check_context_memory(command: str, path, max_ctx: int | None, *,
                         hint: str = "check the trace's positions and --ctx0") -> None:
    """Refuse, before any work, a trace command whose context needs more memory than is available (a
    position near 2**31 in a .npy array, or a large ``--ctx0``, makes a 2**31-token context)."""
    available = available_memory()
    if max_ctx is None or available is None:
        return
    need = TRACE_BYTES_PER_TOKEN * max_ctx
    if need > available:
        raise HisparseError(f"{path}: trace {command} over contexts up to {max_ctx:,} tokens needs about "
                            f"{need / 2**30:.1f} GiB; {available / 2**30:.1f} GiB are available ({hint})")


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


JOBS_PER_CPU = 4  # worker processes beyond this many per CPU only queue (and 100,000 forked the machine to a halt)


def check_jobs(jobs: int, label: str) -> None:
    """Refuse more worker processes than ``JOBS_PER_CPU`` x the usable CPUs; ``label`` names what set them
    (``--jobs 100000``)."""
    cpus = usable_cpus()
    if jobs > JOBS_PER_CPU * cpus:
        raise HisparseError(f"{label}: more worker processes than {JOBS_PER_CPU} x this machine's {cpus} "
                            f"CPU(s) ({JOBS_PER_CPU * cpus}); each is a forked process, the rest would only queue")
