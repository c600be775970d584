"""The crossover pair's barrier protocol (cupy_kernels/sparse_attention.cu, `mla_ws_body` with XO, SE and
SB: variant wsxb, the FP8 default), modelled on the CPU and run under many random interleavings.

The GPU tests check the kernels' outputs; a protocol bug that only a rare timing exposes (a buffer
overwritten while still read, a copy whose source is overwritten before it lands) would pass them
almost always. Here each warpgroup of both CTAs is a coroutine that does what the kernel does
between two barrier operations, the bulk copies land at random later times, and every hand-off is
checked when it happens: no deadlock, every tile read whole and current, no buffer written while a
reader or an in-flight copy still needs it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest


class MBarrier:
    """An mbarrier: `count` arrivals and the announced transaction units complete a phase;
    ``ready(parity)`` is ``mbarrier.try_wait.parity`` (true once the phase of that parity is over)."""

    def __init__(self, count: int) -> None:
        self.count, self.pending, self.tx, self.phases = count, count, 0, 0

    def arrive(self, expect_tx: int = 0) -> None:
        self.tx += expect_tx
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the phase counts"
        self._complete()

    def complete_tx(self, units: int) -> None:
        self.tx -= units
        self._complete()

    def _complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phases += 1
            self.pending = self.count

    def ready(self, parity: int) -> bool:
        return (self.phases & 1) != parity


class Cta:
    """One CTA's barriers (two of each, one per tile buffer) and what its buffers hold."""

    def __init__(self) -> None:
        self.full = [MBarrier(129), MBarrier(129)]  # 128 producer threads + thread 0's expect_tx arrival
        # this CTA's 256 consumer threads and one arrival per consumer warp of the peer (its copies land here)
        self.empty = [MBarrier(256 + 8), MBarrier(256 + 8)]
        self.own_rows = [-1, -1]  # the tile whose rows this CTA's producer wrote into buffer i
        self.peer_rows = [-1, -1]  # the tile whose rows the peer's copy landed in buffer i
        self.readers: list[set[int]] = [set(), set()]  # warpgroups reading buffer i
        self.done: set[tuple[int, int]] = set()  # (warpgroup, tile) consumed
        self.epilogue_ready = False


def run_pair(n_tiles: int, seed: int, epilogue_waits: bool = True) -> list[str]:
    """Both CTAs of one pair over `n_tiles` tiles in a random interleaving; the hazards seen (a
    failed assertion is a deadlock or a stale read). ``epilogue_waits``: WG0 waits on the empty
    phase of tile n - 2 before the warpgroups stage O in its buffer, as the kernel does."""
    rng = random.Random(seed)
    ctas = [Cta(), Cta()]
    in_flight: list[tuple[int, int, int]] = []  # bulk copies: (source CTA, tile, buffer)
    hazards: list[str] = []

    def wait(bar: MBarrier, parity: int) -> Iterator[None]:
        while not bar.ready(parity):
            yield

    def copying(src: int, tile: int) -> bool:
        return any(s == src and t == tile for s, t, _ in in_flight)

    def producer(r: int) -> Iterator[None]:
        me, peer = ctas[r], ctas[r ^ 1]
        for it in range(n_tiles):
            b, parity = it & 1, ((it >> 1) - 1) & 1
            if it >= 2:
                yield from wait(me.empty[b], parity)
            me.full[b].arrive(expect_tx=1)  # the peer's 32 rows, announced
            yield
            if me.readers[b] or (it >= 2 and copying(r, it - 2)):
                hazards.append(f"CTA {r} writes tile {it}'s rows into buffer {b} while it is read")
            me.own_rows[b] = it  # dequantised into its own buffer
            yield
            if peer.readers[b] or (it >= 2 and not {(0, it - 2), (1, it - 2)} <= peer.done):
                hazards.append(f"CTA {r} copies tile {it} into the peer's buffer {b} while it is read")
            in_flight.append((r, it, b))
            for _ in range(128):
                me.full[b].arrive()
            yield

    def consumer(r: int, wg: int) -> Iterator[None]:
        me, peer = ctas[r], ctas[r ^ 1]
        for it in range(n_tiles):
            b = it & 1
            yield from wait(me.full[b], (it >> 1) & 1)
            assert me.own_rows[b] == it and me.peer_rows[b] == it, f"CTA {r} WG{wg} reads a stale tile {it}"
            me.readers[b].add(wg)
            yield
            me.readers[b].discard(wg)
            me.done.add((wg, it))
            for _ in range(128):
                me.empty[b].arrive()
            for _ in range(4):  # lane 0 of each of the warpgroup's 4 warps, on the peer
                peer.empty[b].arrive()
        # the epilogue stages O in buffer n & 1 (tile n - 2's); WG1 after WG0's BAR_EPI
        if wg == 0:
            if epilogue_waits and n_tiles >= 2:
                yield from wait(me.empty[n_tiles & 1], ((n_tiles - 2) >> 1) & 1)
            me.epilogue_ready = True
        else:
            while not me.epilogue_ready:
                yield
        if n_tiles >= 2 and copying(r, n_tiles - 2):
            hazards.append(f"CTA {r} WG{wg} stages O over tile {n_tiles - 2}'s rows while its copy reads them")

    actors = [producer(0), producer(1), consumer(0, 0), consumer(0, 1), consumer(1, 0), consumer(1, 1)]
    for _ in range(200_000):
        if not actors:
            return hazards
        if in_flight and rng.random() < 0.15:  # a copy lands: its rows are in the peer, its source free
            src, tile, b = in_flight.pop(rng.randrange(len(in_flight)))
            ctas[src ^ 1].peer_rows[b] = tile
            ctas[src ^ 1].full[b].complete_tx(1)
        actor = rng.choice(actors)
        try:
            next(actor)
        except StopIteration:
            actors.remove(actor)
    raise AssertionError(f"deadlock: {n_tiles} tiles, seed {seed}")


@pytest.mark.parametrize("epilogue_waits", [True, False])
def test_the_pair_never_deadlocks_and_reads_every_tile_current(epilogue_waits):
    for seed in range(300):
        run_pair(1 + seed % 9, seed, epilogue_waits)  # asserts inside: no deadlock, no stale tile


def test_no_buffer_is_written_while_a_reader_or_a_copy_still_needs_it():
    hazards = [h for seed in range(600) for h in run_pair(1 + seed % 9, seed)]
    assert hazards == []


def test_without_the_epilogue_wait_the_staged_o_can_overwrite_a_copy_in_flight():
    """Why WG0 waits on tile n - 2's empty phase: without it nothing orders this CTA's copy of tile
    n - 2 before the staged O stores over those rows (before 2026-12-07 the kernel did not wait; on
    the GPU that copy was issued a tile earlier). The only hazard the model finds without it."""
    hazards = [h for seed in range(600) for h in run_pair(1 + seed % 9, seed, epilogue_waits=False)]
    assert hazards and all("stages O" in h for h in hazards)
