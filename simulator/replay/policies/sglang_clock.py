"""SGLang's multi-step (MTP) swap-in commit: the CLOCK cache of PR #32162 ("[HiSparse] Support
hisparse multi-step swap io kernel", huangtingwei9988, merged).

Read from SGLang's code: ``python/sglang/kernels/jit/csrc/hisparse_mtp_swap.cuh`` at commit
35306b9d732c624bc7f8f9fe38d6bbff3c239e6c (the file #32162 added, as it stands there; its
wrapper ``python/sglang/kernels/ops/kvcache/hisparse_mtp.py``), kernels
``load_cache_to_device_buffer_mtp_gather_kernel`` and ``..._commit_kernel``. Written here from
that reading, not copied.

One call (a *commit*) takes [steps, k] top-k positions. The gather kernel looks every
occurrence up (a position in the extra page of newest tokens is read there; here: the reserved
newest positions), marks each hot slot it hits with the call's epoch (``ref_epochs[slot] =
epoch``; ``nh`` distinct slots) and gives each distinct missing position one scratch copy
(``nm`` unique misses, numbered by an atomic counter). The commit kernel then updates the cache
with the per-request state (epoch, cursor), epoch = previous + 1:

- *Union path*, when nm + nh <= B (the whole working set fits): miss i (of nm) owns the ring
  positions cursor + i + j*nm (mod B); it samples min(6, its share) of them evenly
  (``CLOCK_VICTIM_SAMPLES``), skips the ones referenced this epoch and takes the one with the
  oldest reference (largest epoch - ref, masked; the first on ties). Misses whose samples are all
  protected then probe the ring from (cursor + i * 2654435761) with stride 2654435761 (mod 2**32,
  mod B) for the first unreferenced slot. Every victim is marked with the epoch.
- *Approximate path* otherwise: every reference is cleared, the slots hit in the *last* step are
  marked again, and only the misses read in the last step are admitted (``APPROX_ADMISSION_STEPS
  = 1``): admitted miss i takes the first unreferenced slot among (j * 2654435761 + epoch) mod
  2**32 mod B for j = i, i + nm, ... < B (then the same probe). The other misses are served from
  scratch but not cached, and hits of earlier steps lose their protection.
- The cursor then advances by min(nm, B); the epoch is kept.

The reference bit is an epoch stamp (ages, not one bit); "the hand" is the cursor, advanced per
call by the number of misses, not swept. Loaded entries start referenced (epoch of the call).

Modelling choices (ours): miss ordinals follow the first occurrence in the flattened [steps, k]
order (SGLang's come from an atomic counter: scheduling order); contending probes are resolved
in ordinal order; the scratch buffer holds every unique miss (its overflow path is not modelled);
the initial prefix buffer is slot p = position p with references 0 (the identity layout its
lookup checks first), and an empty buffer is empty slots with references 0; epochs wrap at
2**min(32 - ceil(log2 B), 23) as in ``PackedRingState``. A commit is ``ReplayConfig.mtp_steps``
consecutive trace steps (the trace holds one top-k per step; the steps stand in for the
speculative positions): see ``step.run_placed``.

Words: 0 reference epoch per slot, 1 planned victim per miss ordinal. Scalars after the step
loop's five: 5 epoch, 6 cursor, 7 epoch mask.
"""

from __future__ import annotations

from numba import njit

from . import PolicyState

STATE = PolicyState(slot_rows=2, position_rows=0, scalars=8)

G_MISSES, G_HITS, G_ORDINAL, G_FLAGS = 0, 1, 2, 3  # written by step.run_placed
FLAG_FILL = 2
G_EPOCH, G_CURSOR, G_MASK = 5, 6, 7
VICTIM_SAMPLES = 6
HASH = 2654435761
M32 = 0xFFFFFFFF


@njit(cache=True)
def epoch_mask(B):  # pragma: no cover - compiled
    bits = 0
    cap = 1
    while cap < B:
        cap <<= 1
        bits += 1
    epoch_bits = min(32 - bits, 23)
    return (1 << epoch_bits) - 1


@njit(cache=True)
def init(sw, pw, g, B, cmax):  # pragma: no cover - compiled
    g[G_EPOCH] = 0
    g[G_CURSOR] = 0
    g[G_MASK] = epoch_mask(B)


@njit(cache=True)
def _probe(ref, B, start, e):  # pragma: no cover - compiled
    """The first slot not referenced this epoch on the stride-2654435761 ring walk from start; -1 if none."""
    for attempt in range(B):
        c = ((start + ((attempt * HASH) & M32)) & M32) % B
        if ref[c] != e:
            ref[c] = e
            return c
    return -1


@njit(cache=True)
def hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    """The whole commit, planned before its misses are placed (SGLang: gather, then commit)."""
    ref = sw[0]
    plan = sw[1]
    nm = g[G_MISSES]
    mask = g[G_MASK]
    e = (g[G_EPOCH] + 1) & mask
    if e == 0:
        e = 1
    cursor = g[G_CURSOR]
    if nm + nh <= B:  # union path
        for i in range(nh):
            ref[hit_slots[i]] = e
        for i in range(nm):
            share = (B - 1 - i) // nm + 1
            samples = min(share, VICTIM_SAMPLES)
            best = -1
            best_age = 0
            for sample in range(samples):
                c = (cursor + i + (sample * share // samples) * nm) % B
                if ref[c] == e:
                    continue
                age = (e - ref[c]) & mask
                if best < 0 or age > best_age:
                    best = c
                    best_age = age
            if best >= 0:
                ref[best] = e
            plan[i] = best
        for i in range(nm):
            if plan[i] < 0:
                plan[i] = _probe(ref, B, ((cursor + ((i * HASH) & M32)) & M32) % B, e)
    else:  # approximate path: keep the last step's working set
        for s in range(B):
            ref[s] = 0
        for i in range(nh):
            if hit_nu[i]:
                ref[hit_slots[i]] = e
        for i in range(nm):
            plan[i] = -1
            if not hit_nu[nh + i]:
                continue  # not admitted: served from scratch only
            j = i
            while j < B:
                c = ((((j * HASH) & M32) + e) & M32) % B
                if ref[c] != e:
                    ref[c] = e
                    plan[i] = c
                    break
                j += nm
        for i in range(nm):
            if plan[i] < 0 and hit_nu[nh + i]:
                plan[i] = _probe(ref, B, ((cursor + ((i * HASH) & M32)) & M32) % B, e)
    g[G_EPOCH] = e
    if nm > 0:
        g[G_CURSOR] = (cursor + min(nm, B)) % B


@njit(cache=True)
def victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    if g[G_FLAGS] & FLAG_FILL:
        return pos  # the prefix buffer: position p in slot p
    return sw[1][g[G_ORDINAL]]


@njit(cache=True)
def insert(sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    sw[0][slot] = g[G_EPOCH]


@njit(cache=True)
def order(sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    return 0  # no recency order to report
