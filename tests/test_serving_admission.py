"""SGLang's admission (PrefillAdder), new_token_ratio and decode retraction, in the serving model."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.cli import main
from simulator.errors import HisparseError
from simulator.serving.admission import (
    AddResult,
    PrefillBudget,
    RatioSchedule,
    Seq,
    ratio_after_retract,
    retract_order,
)
from simulator.serving.model import InstanceSim, System
from simulator.serving.scenario import load_scenario

pytestmark = pytest.mark.usefixtures("private_cache")


# -- the arithmetic, by hand --------------------------------------------------------------------------
def test_ratio_schedule_defaults_and_dp_attention_factor():
    dp = RatioSchedule(1.0, dp_attention=True)  # the blog's colocated flags: no --schedule-conservativeness
    assert dp.effective_conservativeness == pytest.approx(0.3)
    assert dp.init == pytest.approx(0.21) and dp.min == pytest.approx(0.21 * 0.14)
    assert dp.decay == pytest.approx((0.21 - 0.0294) / 600)
    assert dp.after_steps(dp.init, 10) == pytest.approx(0.21 - 10 * dp.decay)
    assert dp.after_steps(dp.init, 10**6) == pytest.approx(dp.min)
    tp = RatioSchedule(1.0, dp_attention=False)
    assert tp.init == pytest.approx(0.7)
    assert RatioSchedule(2.0, dp_attention=False).init == 1.0  # clipped at 1
    with pytest.raises(HisparseError, match="schedule_conservativeness = -1"):
        RatioSchedule(-1.0, dp_attention=False)


def test_estimate_path_hand_computed():
    """add_one_req: prompt + min(max_new - out, 4096) + page against the pool less the running
    requests' reservation at new_token_ratio."""
    running = [Seq(max_new=8192, out=100, prompt=1000)]
    b = PrefillBudget(available=10_000, running=running, ratio=0.5, chunk_tokens=8192, page=64, ignore_eos=False)
    assert b.rem_total == pytest.approx(10_000 - 4096 * 0.5)
    n, res = b.add_new(Seq(8192, 0, 3000), 3000)  # 3000 + 4096 + 64 = 7160 < 7952
    assert (n, res) == (3000, AddResult.CONTINUE)
    assert b.rem_total == pytest.approx(7952 - (3008 + 4096 + 64))  # 784 left
    n, res = b.add_new(Seq(8192, 0, 100), 100)  # 100 + 4096 + 64 >= 784
    assert (n, res) == (0, AddResult.NO_TOKEN)


def test_ignore_eos_look_ahead_hand_computed():
    """add_one_req_ignore_eos: the pool must hold every request's remaining output up to the
    moment each one finishes (sorted by tokens left)."""
    running = [Seq(max_new=100, out=50, prompt=200)]  # 50 left, 250 occupied
    # cur = 1000 - 300 = 700; i=0 (bs 2): 700 - 2 x 50 = 600 > 2; i=1 (bs 1): 700 + 250 - 100 = 850 > 1
    b = PrefillBudget(available=1000, running=running, ratio=0.0, chunk_tokens=10_000, page=1, ignore_eos=True)
    assert b.add_new(Seq(100, 0, 300), 300) == (300, AddResult.CONTINUE)
    # the same with 500 of output: i=1 needs 700 + 250 - 500 = 450 > 1 (fits); with 960 it does not
    b = PrefillBudget(available=1000, running=running, ratio=0.0, chunk_tokens=10_000, page=1, ignore_eos=True)
    assert b.add_new(Seq(500, 0, 300), 300)[0] == 300
    b = PrefillBudget(available=1000, running=running, ratio=0.0, chunk_tokens=10_000, page=1, ignore_eos=True)
    assert b.add_new(Seq(950, 0, 300), 300) == (0, AddResult.NO_TOKEN)  # 700 + 250 - 950 = 0 <= 1
    # the estimate path admits it (300 + min(950, 4096) + 1 < 1000 at ratio 0): it would retract later
    b = PrefillBudget(available=1000, running=running, ratio=0.0, chunk_tokens=10_000, page=1, ignore_eos=False)
    assert b.add_new(Seq(600, 0, 300), 300)[0] == 300


def test_chunks_page_floor_and_chunked_request():
    b = PrefillBudget(available=1 << 20, running=[], ratio=0.2, chunk_tokens=1000, page=64, ignore_eos=False)
    assert b.add_new(Seq(10, 0, 5000), 5000) == (960, AddResult.CONTINUE)  # floored to a page; 40 left
    assert b.add_new(Seq(10, 0, 500), 500) == (0, AddResult.OTHER)  # no page of chunk budget left
    b = PrefillBudget(available=1 << 20, running=[], ratio=0.2, chunk_tokens=1000, page=64, ignore_eos=True)
    assert b.add_new(Seq(10, 0, 5000), 5000) == (1000, AddResult.OTHER)  # the ignore-eos path does not floor
    b = PrefillBudget(available=1 << 20, running=[], ratio=0.2, chunk_tokens=8192, page=64, ignore_eos=True)
    assert b.add_chunked(Seq(10, 0, 20000), 20000 - 16384) == 3616  # the last chunk of a chunked request
    assert b.add_new(Seq(10, 0, 4000), 4000)[0] == 4000  # a second request packs into the same batch
    assert b.add_new(Seq(10, 0, 4000), 4000) == (512, AddResult.OTHER)  # and a third gets the rest


def test_retract_order_and_new_ratio():
    seqs = [Seq(100, 10, 500), Seq(100, 40, 100), Seq(100, 10, 900), Seq(100, 70, 100)]
    # fewest generated first; among equals the longest prompt first
    assert retract_order(seqs) == [2, 0, 1, 3]
    kept = [seqs[1], seqs[3]]
    assert ratio_after_retract(kept) == pytest.approx((40 + 70 + 20 * 2) / (200 + 1))


# -- in the simulation ---------------------------------------------------------------------------------
def _small_pool(pool_tokens: int, *, ignore_eos: bool, conservativeness: float = 1.0, n_in=1024, n_out=2048,
                jitter=0.0, requests=3, deployment="8xh200-tp8"):
    sc = load_scenario(deployment=deployment, calibration="uncalibrated")
    dep = dataclasses.replace(sc.deployment, max_total_tokens=pool_tokens, max_running_requests=0,
                              schedule_conservativeness=conservativeness)
    w = dataclasses.replace(sc.workload, input_tokens=n_in, output_tokens=n_out, ignore_eos=ignore_eos,
                            length_jitter=jitter, requests_per_client=requests)
    return sc.replace(deployment=dep, workload=w)


def test_over_admission_retracts_and_reprefills():
    """The new_token_ratio estimate reserves only part of each running request's output, so with
    staggered requests the pool overfills; the decode memory check then retracts requests, which
    prefill their prompt and output so far again (the prefill passes run every re-prefilled token).
    The exact look-ahead of ignore_eos never retracts."""
    sc = _small_pool(4 * 3136, ignore_eos=False, jitter=0.3)
    sim = InstanceSim(sc, System.BASELINE, concurrency=8)
    r = sim.run()
    assert r.requests == 8 * 3 and all(q.generated == q.output_tokens for q in sim.finished)
    assert r.retractions > 0
    assert sim.prefill_tokens == sum(q.input_tokens for q in sim.finished) + r.reprefill_tokens
    retracted = [q for q in sim.finished if q.retractions]
    assert retracted and r.reprefill_tokens > sum(q.input_tokens * q.retractions for q in retracted)  # + output
    assert sim.peak_device <= sim.plan.pool_tokens
    exact = InstanceSim(_small_pool(4 * 3136, ignore_eos=True, jitter=0.3), System.BASELINE, concurrency=8)
    e = exact.run()
    assert e.retractions == 0 and e.requests == 24
    assert exact.prefill_tokens == sum(q.input_tokens for q in exact.finished)


def test_ratio_decays_per_decode_step():
    sc = _small_pool(1 << 20, ignore_eos=False, n_out=300, requests=1)
    sim = InstanceSim(sc, System.BASELINE, concurrency=1)
    seen: list[float] = []
    batch = sim.adder.batch

    def recording(k):
        seen.append(k.ratio)  # what each scheduling round starts from
        return batch(k)

    sim.adder.batch = recording
    sim.run()
    # the round after the request finished (before the idle reset): 299 decode steps of decay
    assert seen[-1] == pytest.approx(sim.ratios.after_steps(0.7, 299))
    assert seen[0] == pytest.approx(0.7)


def test_conservativeness_changes_the_running_set():
    """Two running requests with 2000 tokens to go reserve 2 x 2000 x 0.7 = 2800 slots at
    conservativeness 1.0 (init ratio 0.7, TP attention) and 840 at 0.3; a waiting 1024 + 2048
    request needs 1024 + 2048 + 64 = 3136 below 5000 free minus that: only 0.3 admits it."""
    from simulator.serving.model import Request

    admitted = {}
    for c in (1.0, 0.3):
        sim = InstanceSim(_small_pool(1 << 20, ignore_eos=False, conservativeness=c), System.BASELINE,
                          concurrency=1)
        k = sim.ranks[0]
        k.running = [Request(i, 1024, 2048, i, 0.0, generated=48) for i in range(2)]
        k.waiting = [Request(9, 1024, 2048, 9, 0.0, target=1024)]
        k.pool.free_device = 5000
        admitted[c] = [r.rid for r, _ in sim.adder.batch(k)]
    assert admitted == {1.0: [], 0.3: [9]}
    runs = [InstanceSim(_small_pool(4 * 3136, ignore_eos=False, conservativeness=c, jitter=0.3), System.BASELINE,
                        concurrency=16).run() for c in (1.0, 0.3)]
    assert runs[0] != runs[1]


def test_deterministic_with_a_seed():
    sc = _small_pool(5 * 3136, ignore_eos=False, jitter=0.3)
    runs = [InstanceSim(sc, System.BASELINE, concurrency=12, seed=7).run() for _ in range(2)]
    assert runs[0] == runs[1] and runs[0].retractions > 0
    assert InstanceSim(sc, System.BASELINE, concurrency=12, seed=8).run() != runs[0]


def test_hisparse_admission_reads_the_device_pool():
    """HiSparse's allocator reports min(logical, device) free: the look-ahead charges every running
    request's remaining output to the device slots. Blog config, 32K/8K, current SGLang's cell (96,832
    device slots per rank): in a first wave n running requests hold 4160 slots each and all have
    ~8192 outputs to go, so the next one fits while free - 32768 - 8192 (n + 1) > n + 1: 5. Once
    outputs are evenly staggered (batch_is_full is cleared every round, so admission is retried each
    step) only the request nearest its end binds: free - 32768 - t_min (n + 1) > n + 1 with
    t_min = 8192 - 8192 (n - 1) // n: 14 per rank."""
    sc = load_scenario(calibration="uncalibrated")
    import numpy as np

    from simulator.serving.misses import MissProfiles
    sim = InstanceSim(sc, System.HISPARSE, concurrency=1, profiles=MissProfiles((np.zeros(8),), "t"))
    plan, out, prompt = sim.plan, 8192, 32768
    first = 0
    while plan.pool_tokens - plan.buffer_slots * first - prompt - out * (first + 1) > first + 1:
        first += 1
    assert plan.pool_tokens == 96_832 and first == 5  # 96,896 before weights_proj was counted bf16
    n = first
    while plan.pool_tokens - plan.buffer_slots * n - prompt - (out - out * (n - 1) // n) * (n + 1) > n + 1:
        n += 1
    assert sim._memory_limit() == n == 14
    base = InstanceSim(sc, System.BASELINE, concurrency=1)
    assert base._memory_limit() == base.plan.pool_tokens // (prompt + out + 1) == 4


def test_hisparse_running_set_grows_past_the_first_wave():
    """Admission retried after every decode step (HiSparse) lets requests in as the running ones
    near their end: over several waves the ranks run more than the first wave's 5 each, up to the
    steady limit of about 14 (and the device pool never overfills); the baseline, latched until a
    request leaves, stays at its 4."""
    import numpy as np

    from simulator.serving.misses import MissProfiles

    sc = load_scenario(calibration="uncalibrated")
    sc = sc.replace(workload=dataclasses.replace(sc.workload, requests_per_client=3))
    sim = InstanceSim(sc, System.HISPARSE, concurrency=256, profiles=MissProfiles((np.zeros(8),), "t"))
    r = sim.run()
    assert 5 * 8 < r.peak_running_deployment <= 8 * (sim.plan.pool_tokens // sim.plan.buffer_slots)
    assert r.retractions == 0 and sim.peak_device <= sim.plan.pool_tokens
    base = InstanceSim(sc, System.BASELINE, concurrency=256).run()
    assert base.peak_running_deployment == 8 * 4


def test_never_admitted_is_an_error_naming_the_files():
    sc = _small_pool(3072, ignore_eos=True)  # 3072 - 1024 - 2048 = 0 <= 1 (the old whole-context check passed)
    with pytest.raises(HisparseError, match=r"8xh200-tp8.toml.*never admits a request of 1024 \+ 2048"):
        InstanceSim(sc, System.BASELINE, concurrency=1)


def test_bad_conservativeness_key_exits_2(tmp_path, capsys):
    src = load_scenario().deployment.where
    lines = [ln for ln in open(src).read().splitlines() if not ln.startswith("schedule_conservativeness")]
    text = "\n".join(lines) + "\nschedule_conservativeness = -0.5\n"
    bad = tmp_path / "dep.toml"
    bad.write_text(text)
    assert main(["plan", "--deployment", str(bad), "--concurrency", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "dep.toml" in err and "schedule_conservativeness = -0.5 must be >= 0" in err


def test_no_token_latches_for_the_baseline_not_for_hisparse():
    """SGLang clears batch_is_full after a pass whose chunked request continues (the filtered last
    batch is smaller), not after its last chunk; under HiSparse get_next_batch_to_run resets it every
    round. Blog config, 32K/8K, one wave: in the round of the 5th prompt's last chunk the look-ahead
    sees that prompt's 24,576 prefilled device slots plus the chunk: 96,896 - 4 x 4,160 - 24,576 -
    (8,192 + 64) - 32,768 = 14,656 free for 6 x 8,192 tokens to come: NO_TOKEN. With the latch the
    wave would stop at 5 per rank; without it HiSparse tries again every step, and as the running
    requests near their end all 8 of each rank's clients run at once. The baseline's look-ahead
    refuses a 5th anyway (5 x 40,960 > 166,720)."""
    import numpy as np

    from simulator.serving.misses import MissProfiles

    sc = load_scenario(calibration="uncalibrated")
    sc = sc.replace(workload=dataclasses.replace(sc.workload, requests_per_client=1))
    sim = InstanceSim(sc, System.HISPARSE, concurrency=64, profiles=MissProfiles((np.zeros(8),), "t"))
    r = sim.run()
    assert r.peak_running_deployment == 64 and r.retractions == 0
    base = InstanceSim(sc, System.BASELINE, concurrency=64).run()
    assert base.peak_running_deployment == 32 and base.retractions == 0


# -- PD decode: DecodePreallocQueue ----------------------------------------------------------------
def test_decode_preallocation_hand_computed():
    """_allocatable_tokens and pop_preallocated (disaggregation/decode.py @ 712b01d8): two running
    requests of 1000 + 100/500 out hold retractable 2,600 tokens; allocatable = 10,000 -
    max(512 x 2, max(min(2048, 4096) + 1000 - 2600) = 448) = 8,976; each 1,000-token prompt needs
    1,512 (and 1000 + 2048 - 2600 = 448): five fit (7,560), the sixth does not (8,976 - 7,560 =
    1,416). A retracted request counts its input + out + 512 against it; the device budget caps."""
    from simulator.serving.admission import decode_allocatable, decode_preallocs

    running = [Seq(2048, 100, 1000), Seq(2048, 500, 1000)]
    assert decode_allocatable(10_000, running) == 10_000 - 1024
    queue = [Seq(2048, 1, 1000)] * 8
    assert decode_preallocs(queue, running, 10_000) == 5
    assert decode_preallocs(queue, running, 10_000, device_requests=3) == 3
    assert decode_preallocs(queue, running, 10_000, retracted=[Seq(2048, 300, 1000)]) == 4  # 8,976 - 1,812
    # nothing running: a request needs its prompt + min(max_new, 4096) as well (need_space_for_single_req 0)
    assert decode_preallocs([Seq(8192, 1, 1000)], [], 5000) == 0 and decode_preallocs([Seq(8192, 1, 1000)], [], 5200) == 1


def _pd_small(pool_tokens: int, requests: int = 3):
    sc = load_scenario(deployment="2xh20-pd-decode", calibration="uncalibrated")
    dep = dataclasses.replace(sc.deployment, max_total_tokens=pool_tokens, prefill_tok_s=1e12)
    w = dataclasses.replace(sc.workload, input_tokens=1024, output_tokens=2048, length_jitter=0.3,
                            requests_per_client=requests)
    return sc.replace(deployment=dep, workload=w)


def test_pd_decode_over_admits_retracts_and_resumes():
    """A decode node reserves a prompt + 512 tokens, not the outputs: with a pool of four whole
    contexts it runs more than four requests, their growth fails the decode memory check, and
    retract_decode offloads some to host memory; they resume (their KV copied back) and every
    request finishes with its full output, the pool never overfilled; nothing is prefilled again."""
    sim = InstanceSim(_pd_small(4 * 3136), System.BASELINE, concurrency=64)
    r = sim.run()
    assert r.requests == len(sim.finished) == sim.clients * 3
    assert all(q.generated == q.output_tokens for q in sim.finished)
    assert r.peak_running_deployment > 4 * 8
    assert r.retractions > 0 and r.reprefill_tokens == 0
    assert sim.peak_device <= sim.plan.pool_tokens
    assert all(not k.retracted for k in sim.ranks)


def test_pd_decode_hisparse_admits_against_the_logical_pool_and_hot_buffers():
    """HiSparse on a decode node: pre-allocation reads the logical pool (not min(logical, device))
    and at most device free // padded buffer requests take hot buffers. One round, nothing running:
    each 32K prompt needs 32,768 + 512 and the round's allocatable must also hold 32,768 + 4,096."""
    import numpy as np

    from simulator.serving.misses import MissProfiles
    from simulator.serving.model import Request

    sc = load_scenario(deployment="2xh20-pd-decode", calibration="uncalibrated")
    for device_bound in (True, False):
        sim = InstanceSim(sc, System.HISPARSE, concurrency=1, profiles=MissProfiles((np.zeros(8),), "t"))
        k = sim.ranks[0]
        if not device_bound:
            k.pool.free_device = 10**8  # room for any number of hot buffers: the logical pool binds
        device_before = k.pool.free_device
        k.waiting = [Request(i, 32768, 8192, i, 0.0, generated=1) for i in range(40)]
        sim.prealloc.admit(k)
        by_logical, alloc = 0, sim.plan.host_tokens
        while max(32768 + 512, 32768 + 4096) <= alloc:
            alloc -= 32768 + 512
            by_logical += 1
        buffers = device_before // sim.plan.buffer_slots
        want = min(buffers, by_logical, sim.plan.max_running)
        assert want == (buffers if device_bound else by_logical) and want > 0
        assert len(k.running) == want and len(k.waiting) == 40 - want
        assert k.pool.free_device == device_before - want * sim.plan.buffer_slots
        assert k.pool.free_host == sim.plan.host_tokens - want * 32768


def test_a_retracted_hisparse_request_restarts_its_trace():
    """SGLang resets a retracted request's hot buffer and LRU: after its re-prefill (colocated) or
    its resumption (pd-decode) its misses follow the trace from step 0 again, and on a decode node
    that first step misses everything (the buffer starts empty)."""
    import numpy as np

    from simulator.serving.misses import MissProfiles
    from simulator.serving.model import Request

    ramp = np.linspace(0.9, 0.1, 64)  # a trace whose share falls step by step
    for deployment in ("8xh200-colocated-dp8", "2xh20-pd-decode"):
        sc = load_scenario(deployment=deployment, calibration="uncalibrated")
        sim = InstanceSim(sc, System.HISPARSE, concurrency=1, profiles=MissProfiles((ramp,), "t"))
        k = sim.ranks[0]
        r = Request(0, 32768, 8192, 0, 0.0, generated=1, target=32768, prefilled=32768)
        if sim.pd:
            sim.prealloc.take(k, r)
        else:
            sim._after_prefill(k, r)  # the prompt's last chunk made its first token
        first = sim.decode.step_misses(r, 3)
        r.generated += 20  # 20 steps on, then retracted and back
        later = sim.decode.step_misses(r, 3)
        np.testing.assert_allclose(later, ramp[20:23])
        k.running = [r]
        sim.decode.retract(k, r)
        if sim.pd:
            k.running = []
            sim.prealloc.admit(k)
            assert k.running == [r]
        else:
            r.generated += 1  # the re-prefill's token
            sim._after_prefill(k, r)
        again = sim.decode.step_misses(r, 3)
        np.testing.assert_allclose(again, first)
        if sim.pd:
            assert first[0] == 1.0 and np.allclose(first[1:], ramp[1:3])
        else:
            np.testing.assert_allclose(first, ramp[:3])


def test_the_radix_cache_sends_ignore_eos_requests_through_the_estimate():
    """SGLang's add_one_req takes the exact look-ahead only when ``ignore_eos and getattr(tree_cache,
    "disable", True)``: with the radix cache on (the cookbook cells' flags do not disable it) bench_serving's
    ignore_eos requests are admitted by the new_token_ratio estimate, over-admit and retract, exactly as with
    ignore_eos off; HiSparse requires the radix cache off, so its look-ahead stays."""
    from simulator.serving.prefill_adder import PrefillAdder

    off = _small_pool(4 * 3136, ignore_eos=True, jitter=0.3)
    on = off.replace(deployment=dataclasses.replace(off.deployment, radix_cache=True))
    estimate = _small_pool(4 * 3136, ignore_eos=False, jitter=0.3)
    r_on = InstanceSim(on, System.BASELINE, concurrency=8).run()
    r_est = InstanceSim(estimate, System.BASELINE, concurrency=8).run()
    r_off = InstanceSim(off, System.BASELINE, concurrency=8).run()
    assert r_on.retractions == r_est.retractions > 0 and r_on.reprefill_tokens == r_est.reprefill_tokens
    assert r_off.retractions == 0
    assert not InstanceSim(on, System.BASELINE, concurrency=8).adder.exact
    hs = PrefillAdder.__new__(PrefillAdder)  # the rule alone: HiSparse runs with --disable-radix-cache
    hs.d, hs.w, hs.hs = on.deployment, on.workload, on.hisparse
    assert hs.exact
    hs.w = estimate.workload
    assert not hs.exact  # ignore_eos off: the estimate whatever the cache


def test_the_cookbook_cells_keep_the_radix_cache_and_the_launch_says_so():
    from simulator.serving.launch import launch_command

    for name in ("8xh200-tp8-glm52-low-latency", "8xh200-dp8-ep8-glm52-balanced", "8xh200-dp8-ep8-glm52-high-throughput"):
        sc = load_scenario(model="glm-5.2-fp8", deployment=name)
        assert sc.deployment.radix_cache
        assert "--disable-radix-cache" not in launch_command(sc.model, sc.deployment, None).argv
        assert "--disable-radix-cache" in launch_command(sc.model, sc.deployment, sc.hisparse).argv
    blog = load_scenario()
    assert not blog.deployment.radix_cache  # the blog's flags pass --disable-radix-cache
