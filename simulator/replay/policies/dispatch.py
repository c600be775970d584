"""The policy hooks the step loop calls, one ladder each over the registry's ids.

Generated from the registry (simulator/replay/policies/__init__.py) by
``python -m simulator.replay.policies.generate``: do not edit.
"""

from __future__ import annotations

from numba import literally, njit

from . import arc, clock, fifo, lfu, lru, opt, random_, s3fifo, salru, sglang_clock, sieve

# The policy modules in registry order: MODULES[pid].
MODULES = (lru, fifo, clock, lfu, arc, s3fifo, sieve, random_, opt, salru, sglang_clock)


@njit(cache=True)
def init(pid, sw, pw, g, B, cmax):  # pragma: no cover - compiled
    literally(pid)  # one compiled copy per policy: the other branches fold away
    if pid == 0:  # lru
        lru.init(sw, pw, g, B, cmax)
    elif pid == 1:  # fifo
        fifo.init(sw, pw, g, B, cmax)
    elif pid == 2:  # clock
        clock.init(sw, pw, g, B, cmax)
    elif pid == 3:  # lfu
        lfu.init(sw, pw, g, B, cmax)
    elif pid == 4:  # arc
        arc.init(sw, pw, g, B, cmax)
    elif pid == 5:  # s3fifo
        s3fifo.init(sw, pw, g, B, cmax)
    elif pid == 6:  # sieve
        sieve.init(sw, pw, g, B, cmax)
    elif pid == 7:  # random
        random_.init(sw, pw, g, B, cmax)
    elif pid == 8:  # opt
        opt.init(sw, pw, g, B, cmax)
    elif pid == 9:  # salru
        salru.init(sw, pw, g, B, cmax)
    elif pid == 10:  # sglang-clock
        sglang_clock.init(sw, pw, g, B, cmax)
    else:
        raise ValueError("init: no policy with this id")


@njit(cache=True)
def victim(pid, sw, pw, g, B, cmax, mark, stamp, slot_pos, pos):  # pragma: no cover - compiled
    literally(pid)  # one compiled copy per policy: the other branches fold away
    if pid == 0:  # lru
        return lru.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 1:  # fifo
        return fifo.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 2:  # clock
        return clock.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 3:  # lfu
        return lfu.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 4:  # arc
        return arc.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 5:  # s3fifo
        return s3fifo.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 6:  # sieve
        return sieve.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 7:  # random
        return random_.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 8:  # opt
        return opt.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 9:  # salru
        return salru.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    elif pid == 10:  # sglang-clock
        return sglang_clock.victim(sw, pw, g, B, cmax, mark, stamp, slot_pos, pos)
    else:
        raise ValueError("victim: no policy with this id")


@njit(cache=True)
def insert(pid, sw, pw, g, B, cmax, slot, pos, nu, stamp):  # pragma: no cover - compiled
    literally(pid)  # one compiled copy per policy: the other branches fold away
    if pid == 0:  # lru
        lru.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 1:  # fifo
        fifo.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 2:  # clock
        clock.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 3:  # lfu
        lfu.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 4:  # arc
        arc.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 5:  # s3fifo
        s3fifo.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 6:  # sieve
        sieve.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 7:  # random
        random_.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 8:  # opt
        opt.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 9:  # salru
        salru.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    elif pid == 10:  # sglang-clock
        sglang_clock.insert(sw, pw, g, B, cmax, slot, pos, nu, stamp)
    else:
        raise ValueError("insert: no policy with this id")


@njit(cache=True)
def hits(pid, sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh):  # pragma: no cover - compiled
    literally(pid)  # one compiled copy per policy: the other branches fold away
    if pid == 0:  # lru
        lru.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 1:  # fifo
        fifo.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 2:  # clock
        clock.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 3:  # lfu
        lfu.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 4:  # arc
        arc.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 5:  # s3fifo
        s3fifo.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 6:  # sieve
        sieve.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 7:  # random
        random_.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 8:  # opt
        opt.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 9:  # salru
        salru.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    elif pid == 10:  # sglang-clock
        sglang_clock.hits(sw, pw, g, B, cmax, mark, stamp, hit_slots, hit_nu, nh)
    else:
        raise ValueError("hits: no policy with this id")


@njit(cache=True)
def order(pid, sw, pw, g, B, cmax, out):  # pragma: no cover - compiled
    literally(pid)  # one compiled copy per policy: the other branches fold away
    if pid == 0:  # lru
        return lru.order(sw, pw, g, B, cmax, out)
    elif pid == 1:  # fifo
        return fifo.order(sw, pw, g, B, cmax, out)
    elif pid == 2:  # clock
        return clock.order(sw, pw, g, B, cmax, out)
    elif pid == 3:  # lfu
        return lfu.order(sw, pw, g, B, cmax, out)
    elif pid == 4:  # arc
        return arc.order(sw, pw, g, B, cmax, out)
    elif pid == 5:  # s3fifo
        return s3fifo.order(sw, pw, g, B, cmax, out)
    elif pid == 6:  # sieve
        return sieve.order(sw, pw, g, B, cmax, out)
    elif pid == 7:  # random
        return random_.order(sw, pw, g, B, cmax, out)
    elif pid == 8:  # opt
        return opt.order(sw, pw, g, B, cmax, out)
    elif pid == 9:  # salru
        return salru.order(sw, pw, g, B, cmax, out)
    elif pid == 10:  # sglang-clock
        return sglang_clock.order(sw, pw, g, B, cmax, out)
    else:
        raise ValueError("order: no policy with this id")
