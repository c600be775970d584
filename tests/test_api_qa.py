"""The Python API as a notebook calls it: ``replay``, ``ReplayConfig``, ``expand_configs``,
``PlanInputs`` and ``recommend`` given the wrong thing get a HisparseError naming the argument and
its value, never a crash, a hang, a deep AttributeError or a silently different answer."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from simulator.errors import HisparseError, TraceError
from simulator.replay import ReplayConfig, api, expand_configs, replay
from simulator.replay import backend as paths
from simulator.replay.engine import replay_policy
from simulator.serving.planner import PlanInputs, prepare, recommend
from simulator.trace import Stream, open_trace
from tests.helpers import random_stream

ROOT = Path(__file__).resolve().parents[1]
V1_TRACE = ROOT / "traces" / "synthetic-dsa-like.hst"  # a version-1 file: its index says no largest context


def _stream(seed: int = 0, **kw) -> Stream:
    return random_stream(np.random.default_rng(seed), steps=kw.pop("steps", 30), k=kw.pop("k", 16),
                         ctx0=kw.pop("ctx0", 30), **kw)


def test_a_k_below_the_streams_width_is_refused_not_a_crash():
    # k=8 for 16-wide streams skipped the buffer >= k check, and the compiled engine wrote past its
    # slots: fifo and arc segfaulted, random hung, opt raised a RuntimeError about ctx_len. In a
    # child process, so that the old crash fails this test instead of killing the run.
    code = textwrap.dedent("""
        import numpy as np
        from simulator.errors import HisparseError
        from simulator.replay import ReplayConfig, replay
        from simulator.replay.engine import replay_policy
        from tests.helpers import random_stream
        s = random_stream(np.random.default_rng(0), steps=30, k=16, ctx0=30)
        for policy in ("fifo", "arc", "random", "opt", "lru"):
            try:
                replay([s], ReplayConfig(policy=policy, buffer=12), k=8)
            except HisparseError as exc:
                assert "buffer 12 is smaller than k = 16" in str(exc), exc
            else:
                raise SystemExit(policy + " replayed 16 entries a step in 12 slots")
        for policy in ("fifo", "random"):  # the engine itself, called directly
            try:
                replay_policy(policy, s.indices, s.ctx_len, 12, reserve=True, prefix=True, batched=True, seed=0)
            except ValueError as exc:
                assert "selects 16 entries, more than the buffer's 12 slots" in str(exc), exc
            else:
                raise SystemExit(policy + ": the engine took 16 entries a step in 12 slots")
        rng = np.random.default_rng(7)
        ctx = 40 + np.arange(20, dtype=np.int64)
        rows = np.array([np.r_[c - 1, rng.choice(c - 1, size=15, replace=False)] for c in ctx], dtype=np.int32)
        try:  # 16 entries, the newest among them, and no reserved slot for it: 16 slots needed
            replay_policy("fifo", rows, ctx, 15, reserve=False, prefix=True, batched=True, seed=0)
        except ValueError as exc:
            assert "step 0 selects 16 entries, more than the buffer's 15 slots" in str(exc), exc
        else:
            raise SystemExit("the engine took 16 unreserved entries a step in 15 slots")
        print("refused")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "refused" in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])


def test_the_engine_still_fits_the_newest_token_in_its_reserved_slot():
    rng = np.random.default_rng(7)
    ctx = 40 + np.arange(20, dtype=np.int64)
    rows = np.array([np.r_[c - 1, rng.choice(c - 1, size=15, replace=False)] for c in ctx], dtype=np.int32)
    # 15 slots hold a step's 15 older entries; the 16th, the newest token, has its own slot
    # (without the reserved slot the step is refused: test_a_k_below_the_streams_width_is_refused_not_a_crash)
    run = replay_policy("fifo", rows, ctx, 15, reserve=True, prefix=True, batched=True, seed=0)
    assert run.misses.sum() > 0


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"k": 0}, "k must be a whole number >= 1, got 0"),
    ({"k": -4}, "k must be a whole number >= 1, got -4"),
    ({"k": "16"}, "k must be a whole number >= 1, got '16'"),
    ({"k": 16.0}, "k must be a whole number >= 1, got 16.0"),
    ({"k": True}, "k must be a whole number >= 1, got True"),
    ({"workers": 0}, "workers must be a whole number >= 1, got 0"),
    ({"workers": "2"}, "workers must be a whole number >= 1, got '2'"),
    ({"per_step": "no"}, "per_step must be True or False, got 'no'"),
    ({"progress": 1}, "progress must be True or False, got 1"),
])
def test_replay_options_are_checked(kwargs, named):
    with pytest.raises(HisparseError, match=named):
        replay(_stream(), ReplayConfig(buffer=20), **kwargs)


def test_numpy_integers_are_whole_numbers():
    s = _stream()
    want = replay(s, ReplayConfig(buffer=20)).records
    assert replay(s, ReplayConfig(buffer=np.int32(20)), k=np.int64(16), workers=np.int64(2)).records == want


@pytest.mark.parametrize(("configs", "named"), [
    (["lru"], "configs must be ReplayConfig objects, got 'lru'"),
    ("lru", "configs must be a ReplayConfig or a list of them, got 'lru'"),
    (None, "configs must be a ReplayConfig or a list of them, got None"),
    ({"policy": "lru"}, "configs must be a ReplayConfig or a list of them"),
    ([ReplayConfig(buffer=20), 4096], "configs must be ReplayConfig objects, got 4096"),
    ([{"policy": "lru"}], "configs must be ReplayConfig objects, got {'policy': 'lru'}"),  # was: unhashable type
])
def test_configs_must_be_replay_configs(configs, named):
    with pytest.raises(HisparseError, match=named):
        replay(_stream(), configs)


def test_a_trace_path_is_opened_and_a_bad_one_named():
    cfg = [ReplayConfig(policy="lru", buffer=2048), ReplayConfig(policy="fifo", buffer=4096)]
    assert replay(str(V1_TRACE), cfg).records == replay(open_trace(V1_TRACE), cfg).records
    assert replay(V1_TRACE, cfg[0]).records[0]["streams"] == len(open_trace(V1_TRACE))
    with pytest.raises(TraceError, match="nope.hst: cannot open trace"):
        replay(str(ROOT / "traces" / "nope.hst"), cfg)
    with pytest.raises(TraceError, match="is a folder"):
        replay(ROOT / "traces", cfg)


@pytest.mark.parametrize(("source", "named"), [
    (5, "source must be a trace .* got 5"),
    (None, "source must be a trace .* got None"),
    ([1, 2], "the source yielded a int, not a Stream"),
    ([(np.zeros((2, 2), np.int32), np.arange(2))], "the source yielded a tuple, not a Stream"),
])
def test_a_source_that_is_not_streams_is_named(source, named):
    with pytest.raises(HisparseError, match=named):
        replay(source, ReplayConfig(buffer=20), k=16)


def test_a_stream_of_lists_or_mismatched_shapes_is_named():
    s = _stream()
    with pytest.raises(HisparseError, match="request 0, layer 0: indices must be a numpy array, got list"):
        replay(Stream(0, 0, s.ctx_len, s.indices.tolist()), ReplayConfig(buffer=20))
    with pytest.raises(HisparseError, match=r"request 3, layer 1: indices must be \[steps, width\] and ctx_len "):
        replay(Stream(3, 1, s.ctx_len[:5], s.indices), ReplayConfig(policy="fifo", buffer=20))


@pytest.mark.parametrize(("field", "value", "named"), [
    ("buffer", True, "buffer must be a whole number of slots, got the bool True"),
    ("seed", True, "seed must be a whole number, got the bool True"),
    ("mtp_steps", False, "mtp_steps must be a whole number, got the bool False"),
    ("buffer", 2**31 - 1, "buffer must be at most 2147483646 slots"),
    ("buffer", 10**30, "buffer must be at most 2147483646 slots"),
    ("reserve_newest", "no", "reserve_newest must be True or False, got 'no'"),
    ("reserve_newest", 0, "reserve_newest must be True or False, got 0"),
    ("reserve_newest", None, "reserve_newest must be True or False, got None"),
])
def test_config_fields_are_checked(field, value, named):
    with pytest.raises(HisparseError, match=named):
        ReplayConfig(**{field: value})


def test_a_numpy_bool_is_a_bool():
    cfg = ReplayConfig(reserve_newest=np.bool_(False))
    assert cfg.reserve_newest is False and cfg == ReplayConfig(reserve_newest=False)
    assert replay(_stream(), cfg).records[0]["reserve_newest"] is False


def test_expand_configs_checks_its_lists():
    with pytest.raises(HisparseError, match="buffer must be a whole number of slots, got 4096.5"):
        expand_configs(["lru"], [4096.5])  # was cut to 4096 without a word
    with pytest.raises(HisparseError, match="policies must be a list, got 'lru'"):
        expand_configs("lru", [4096])  # was policy 'l'
    with pytest.raises(HisparseError, match="buffers must be a list, got '4096'"):
        expand_configs(["lru"], "4096")  # was buffers 4, 0, 9, 6: "buffer must be >= 1 slot, got 0"
    with pytest.raises(HisparseError, match="buffers must be a list, got 4096"):
        expand_configs(["lru"], 4096)
    got = expand_configs(("lru", "opt"), np.array([2048, 4096]), semantics="sequential")
    assert [(str(c.policy), c.buffer, type(c.buffer)) for c in got] == [
        ("lru", 2048, int), ("lru", 4096, int), ("opt", 2048, int), ("opt", 4096, int)]


POLICIES = ("lru", "fifo", "clock", "lfu", "arc", "s3fifo", "sieve", "random", "opt", "salru", "sglang-clock",
            "none", "static-prefix")


@pytest.mark.parametrize("semantics", ["batched", "sequential"])
def test_a_buffer_past_the_largest_context_misses_as_that_context(monkeypatch, semantics):
    # every step is on the fast path (ctx_len <= buffer), so a buffer of the largest context misses
    # the same; the engine's memory grows with the slots (a 2**31-slot sequential LRU took 23 GB
    # to replay 30 steps; fifo at 2**25 slots took 5 GB), so the replay runs at that size
    s = _stream(ctx0=20, steps=40, overlap=0.5)
    cmax = int(s.ctx_len.max())
    seen = []
    real = paths.stream_misses
    monkeypatch.setattr(paths, "stream_misses", lambda stream, cfg: seen.append(cfg.buffer) or real(stream, cfg))
    for policy in POLICIES:
        if policy in ("salru", "sglang-clock") and semantics == "sequential":
            continue
        for initial in ("prefix", "empty"):
            common = dict(policy=policy, semantics=semantics, initial=initial, ways=4)
            small = replay(s, ReplayConfig(buffer=-(-cmax // 4) * 4, **common), per_step=True)
            huge = replay(s, ReplayConfig(buffer=2**31 - 4, **common), per_step=True)
            assert np.array_equal(small.streams[0].misses, huge.streams[0].misses), (policy, initial)
            assert huge.records[0]["buffer"] == 2**31 - 4  # the record keeps the buffer asked for
    assert seen and max(seen) < 2 * cmax


def test_a_huge_buffer_on_a_trace_that_does_not_say_its_largest_context():
    # a version-1 .hst's index has no ctx_last: the coded C path allocated the whole buffer
    # (MemoryError for lru; opt was killed for memory)
    assert open_trace(V1_TRACE).max_ctx is None
    largest = max(int(s.ctx_len.max()) for s in open_trace(V1_TRACE))
    (rec,) = replay(V1_TRACE, ReplayConfig(buffer=2**31 - 2)).records
    (want,) = replay(V1_TRACE, ReplayConfig(buffer=largest)).records
    assert (rec["misses"], rec["accesses"], rec["streams"]) == (want["misses"], want["accesses"], want["streams"])


def test_per_step_with_no_streams_is_an_empty_frame():
    result = replay([], ReplayConfig(buffer=20), per_step=True)
    frame = result.per_step
    assert frame is not None and len(frame) == 0  # was None, which the docstring keeps for per_step=False
    assert list(frame.columns) == ["request", "layer", "step", "ctx_len", "policy", "buffer", "misses"]
    assert replay([], ReplayConfig(buffer=20)).per_step is None
    full = replay(_stream(), ReplayConfig(buffer=20), per_step=True).per_step
    assert dict(frame.dtypes) == dict(full.dtypes)


def test_the_gpu_backend_keeps_the_per_layer_totals(monkeypatch):
    # the gpu branch built its ReplayResult without ``by_layer``: group_records gave nothing
    from simulator.replay import gpu

    streams = [Stream(0, layer, s.ctx_len, s.indices) for layer, s in enumerate([_stream(1), _stream(2)])]
    cfg = ReplayConfig(buffer=20)
    monkeypatch.setattr(gpu, "check", lambda configs: None)
    monkeypatch.setattr(gpu, "replay_streams", lambda it, configs, add: [
        add(s, c, paths.stream_misses(s, c)) for s in it for c in configs])
    on_gpu = replay(streams, cfg, backend="gpu")
    on_cpu = replay(streams, cfg)
    assert on_gpu.records == on_cpu.records
    assert on_gpu.by_layer == on_cpu.by_layer and set(on_gpu.by_layer[cfg]) == {0, 1}
    assert on_gpu.group_records([0, 0]) == on_cpu.group_records([0, 0]) != []


def test_replay_changes_nothing_it_is_given_and_repeats_itself():
    streams = [_stream(i, request=i, ragged=True) for i in range(3)]
    before = [(s.indices.copy(), s.ctx_len.copy()) for s in streams]
    configs = expand_configs(["lru", "fifo", "random", "opt", "static-prefix"], [16, 24], seed=3)
    kept = list(configs)
    one = replay(streams, configs, per_step=True, workers=1, k=16)
    two = replay(streams, configs, per_step=True, workers=2, k=16)
    three = replay(iter(streams), tuple(configs), per_step=True, workers=3, k=16)
    assert configs == kept
    for s, (idx, ctx) in zip(streams, before, strict=True):
        assert np.array_equal(s.indices, idx) and np.array_equal(s.ctx_len, ctx)
    assert one.records == two.records == three.records
    assert one.per_step.equals(two.per_step) and one.per_step.equals(three.per_step)


# ---- the planner's inputs ------------------------------------------------------------------------

def test_plan_inputs_lists_become_tuples_and_numpy_numbers_plain():
    inp = PlanInputs(concurrency=[np.int64(4), 8], rates=[np.float64(0.5)], buffers=[np.int32(4096)],
                     host_ratios=[2], overrides=["gpu.link_bw=27.7e9"], residencies=["swap"], seed=np.int64(3),
                     slo_tpot_ms=50, deployment=Path("8xh200-colocated-dp8"))
    assert inp.concurrency == (4, 8) and all(type(c) is int for c in inp.concurrency)
    assert inp.rates == (0.5,) and inp.buffers == (4096,) and inp.host_ratios == (2.0,)
    assert inp.overrides == ("gpu.link_bw=27.7e9",) and inp.residencies == ("swap",)
    assert type(inp.seed) is int and inp.slo_tpot_ms == 50.0 and inp.deployment == "8xh200-colocated-dp8"
    assert hash(inp) == hash(PlanInputs(concurrency=(4, 8), rates=(0.5,), buffers=(4096,), host_ratios=(2.0,),
                                        overrides=("gpu.link_bw=27.7e9",), residencies=("swap",), seed=3,
                                        slo_tpot_ms=50.0))


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"concurrency": (1.5, 2)}, "concurrency takes whole numbers, got 1.5"),
    ({"concurrency": (True,)}, "concurrency takes whole numbers, got True"),
    ({"concurrency": 8}, "concurrency must be a tuple, got 8"),
    ({"concurrency": "8"}, "concurrency must be a tuple, got '8'"),
    ({"concurrency": (4, 4, 2)}, r"concurrency \(4, 4, 2\): a value given twice"),
    ({"rates": (float("nan"),)}, "rates takes finite numbers, got nan"),
    ({"rates": (float("inf"),)}, "rates takes finite numbers, got inf"),
    ({"rates": "1"}, "rates must be a tuple, got '1'"),
    ({"buffers": (4096.5,)}, "buffers takes whole numbers, got 4096.5"),
    ({"buffers": ("4096",)}, "buffers takes whole numbers, got '4096'"),
    ({"host_ratios": (float("inf"),)}, "host_ratios takes finite numbers, got inf"),
    ({"host_ratios": ("4",)}, "host_ratios takes finite numbers, got '4'"),
    ({"residencies": "swap"}, "residencies must be a tuple, got 'swap'"),  # was residency 's'
    ({"overrides": "gpu.link_bw=1e9"}, "overrides must be a tuple, got 'gpu.link_bw=1e9'"),
    ({"overrides": (("gpu.link_bw", 1e9),)}, "overrides takes strings"),
    ({"slo_tpot_ms": "100"}, "slo_tpot_ms takes numbers, got '100'"),
    ({"slo_ttft_s": "30"}, "slo_ttft_s takes numbers, got '30'"),
    ({"seed": "1"}, "seed takes whole numbers, got '1'"),
    ({"seed": -1}, "seed must be from 0 to 2\\*\\*63 - 1, got -1"),
    ({"model": None}, "model must be a preset name or a file path"),  # was AttributeError: 'strip'
    ({"workload": 32}, "workload must be a preset name or a file path .* got 32"),
])
def test_plan_inputs_name_a_bad_field(kwargs, named):
    with pytest.raises(HisparseError, match=named):
        PlanInputs(**kwargs)


def test_plan_inputs_keep_their_existing_checks():
    with pytest.raises(HisparseError, match="--concurrency needs positive integers"):
        PlanInputs(concurrency=())
    with pytest.raises(HisparseError, match="--slo-tpot-ms -5 must be > 0"):
        PlanInputs(slo_tpot_ms=-5)
    with pytest.raises(HisparseError, match="slo_tpot_ms takes numbers, got nan"):
        PlanInputs(slo_tpot_ms=float("nan"))
    assert PlanInputs(slo_tpot_ms=float("inf"), slo_ttft_s=None).slo_ttft_s is None


def _row(system: str, tok_s: float, load: int) -> dict:
    return {"system": system, "overloaded": False, "tpot_p99_ms": 10.0, "ttft_p99_s": 1.0,
            "steady_tok_s_deployment": tok_s, "concurrency": load, "rate_per_s": 0.0}


@pytest.mark.parametrize(("args", "named"), [
    (("100",), "slo_tpot_ms must be a number > 0, got '100'"),
    ((float("nan"),), "slo_tpot_ms must be a number > 0, got nan"),
    ((0,), "slo_tpot_ms must be a number > 0, got 0"),
    ((100, "30"), "slo_ttft_s must be a number > 0, got '30'"),
    ((100, None, float("nan")), "band must be a number >= 0, got nan"),
])
def test_recommend_names_a_bad_target(args, named):
    rows = [_row("baseline", 100.0, 1), _row("hisparse", 150.0, 1)]
    with pytest.raises(HisparseError, match=named):
        recommend(rows, *args)
    assert recommend(rows, 100)["choice"]["system"] == "hisparse"


def test_fitted_keeps_salru_whole_shards():
    cfg = ReplayConfig(policy="salru", buffer=2**20, ways=32)
    fit = api._fitted(cfg, 1000)
    assert fit.buffer == 1024 and fit.buffer % 32 == 0
    assert api._fitted(cfg, None) is cfg and api._fitted(ReplayConfig(buffer=512), 1000).buffer == 512


@pytest.mark.parametrize(("trace", "named"), [("nope.hst", "nope.hst: no such trace file"),
                                              ("traces", "traces: is a folder, not a trace file")])
def test_a_missing_trace_is_refused_before_any_point(monkeypatch, trace, named):
    # prepare() let it through (its work budget counts a missing trace as 0 accesses), and the
    # first knob set's replay said so only after every baseline point had been simulated
    from simulator.serving import planner
    from tests.helpers import Reached, reached

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(planner, "simulate", reached)
    with pytest.raises(HisparseError, match=named):
        prepare(PlanInputs(trace=trace, concurrency=(1,)))
    with pytest.raises(HisparseError, match=named):
        planner.run_plan(PlanInputs(trace=trace, concurrency=(1,)))
    with pytest.raises(Reached):  # a trace that is there gets to the simulation
        planner.run_plan(PlanInputs(trace="traces/glm51-longbench.hst", concurrency=(1,)))
