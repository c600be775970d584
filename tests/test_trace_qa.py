"""QA pass over `hisparse trace`: defects found by trying the commands with odd inputs, each
test failing before its fix (a traceback, a misleading message, an unreadable file written, a
tiny trace refused as "out of memory")."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator.errors import TraceError
from simulator.trace import Stream, TraceWriter, open_trace
from tests.fuzzing import run_cli
from tests.hst_craft import coded_chunk, craft


# -- the writer -----------------------------------------------------------------------------
def test_writer_refuses_a_stream_of_no_steps_instead_of_writing_an_unreadable_file(tmp_path):
    """A new stream of 0 steps was written as a 0-step chunk, which every reader then refused
    ("index entry at step 0: impossible field values")."""
    path = tmp_path / "z.hst"
    empty = Stream(0, 0, np.zeros(0, np.int64), np.zeros((0, 4), np.int32))
    with pytest.raises(TraceError, match="no steps cannot be stored"), TraceWriter(path, k=4, source={}) as w:
        w.write_stream(empty)
    assert list(tmp_path.iterdir()) == []  # nothing half-written
    # a continuation of no steps adds nothing: the file reads back with the stream's one step
    with TraceWriter(path, k=4, source={}) as w:
        w.write_stream(Stream(0, 0, np.array([5], np.int64), np.array([[0, 4]], np.int32)))
        w.write_stream(empty)
    s = open_trace(path).read((0, 0))
    assert s.steps == 1 and s.step(0).tolist() == [0, 4]


@pytest.mark.parametrize("field, value, says", [
    ("request", -1, "request -1 cannot be stored"),
    ("layer", 2**32, "layer 4294967296 cannot be stored"),
    ("first_step", 2**32 - 1, "steps 4294967295..4294967296 cannot be stored"),
])
def test_writer_names_a_number_the_format_cannot_store(tmp_path, field, value, says):
    """Requests, layers and steps are u32 on disk: struct.error ("argument out of range",
    naming nothing) escaped from the writer."""
    kw = {"request": 0, "layer": 0, "first_step": 0, field: value}
    s = Stream(kw["request"], kw["layer"], np.array([5, 6], np.int64), np.array([[0, 1], [0, 2]], np.int32),
               kw["first_step"])
    with pytest.raises(TraceError, match=says), TraceWriter(tmp_path / "w.hst", k=4, source={}) as w:
        w.write_stream(s)
    with pytest.raises(TraceError, match="layer -3 cannot be stored"), \
            TraceWriter(tmp_path / "w.hst", k=4, source={}) as w:
        w.write(0, -3, 0, 5, [1])  # the step-at-a-time API says so at once, not when the chunk is flushed
    assert list(tmp_path.iterdir()) == []


def test_a_huge_context_over_few_positions_is_written_and_read(tmp_path):
    """ctx_len sized the codec's tables: a 2-step stream at ctx_len 2**40 raised MemoryError."""
    s = Stream(0, 0, np.array([2**40, 2**40 + 1], np.int64), np.array([[0, 1], [0, 2]], np.int32))
    with TraceWriter(tmp_path / "h.hst", k=4, source={}) as w:
        w.write_stream(s)
    back = open_trace(tmp_path / "h.hst").read((0, 0))
    assert back.ctx_len.tolist() == [2**40, 2**40 + 1] and back.indices.tolist() == [[0, 1], [0, 2]]


def test_validate_of_a_small_npy_at_a_huge_ctx0_is_not_out_of_memory(tmp_path, capsys):
    """`trace validate x.npy --ctx0 5000000000` on 3 steps said "out of memory": the compiled
    check's table was as long as the context."""
    path = tmp_path / "t.npy"
    np.save(path, np.array([[0, 1, 2, -1], [0, 1, 3, -1], [4, 1, -1, -1]], np.int32))
    code, out, err = run_cli(["trace", "validate", str(path), "--ctx0", "5000000000"], capsys)
    assert code == 0, err
    assert "valid (1 streams, 3 steps, 8 accesses, k = 4)" in out


def test_compiled_check_at_huge_ctx_gives_the_reference_answer():
    """The compiled check, its table sized by the largest position (not ctx_len, up to 2**40 here),
    reports the same first problem (code, step, value, extra) as the numba reference, for every
    kind of problem."""
    from simulator import native
    from simulator.trace import codec_jit

    if not native.available():
        pytest.skip("the compiled module is not built (the numba reference is the only check)")
    rng = np.random.default_rng(7)
    for case in range(300):
        steps, width = int(rng.integers(1, 8)), int(rng.integers(1, 6))
        rows = rng.integers(0, 40, size=(steps, width)).astype(np.int32)
        ctx = np.sort(rng.integers(30, 2**40, size=steps)).astype(np.int64)
        kind = case % 7
        t = int(rng.integers(0, steps))
        if kind == 1:
            rows[t, 0] = -5
        elif kind == 2:
            ctx[t:] = 20 + np.arange(steps - t)  # positions up to 39 past ctx_len
            ctx[:t] = np.minimum(ctx[:t], 20)
        elif kind == 3 and t:
            ctx[t] = ctx[t - 1] - 1
        elif kind == 4:
            ctx[t] = 0 if t == 0 else ctx[t]
        elif kind == 5:
            rows[t, -1] = -1
        for r in range(steps):  # sorted rows, unique unless the draw repeats
            rows[r] = np.sort(rows[r])
        want = tuple(int(x) for x in codec_jit.check_rows(rows.astype(np.int64), ctx, width - (kind == 6)))
        got = tuple(int(x) for x in native.check_rows(rows, ctx, width - (kind == 6)))
        assert got == want, (case, rows.tolist(), ctx.tolist())


# -- info / validate on a trace of no streams --------------------------------------------------
def test_a_trace_of_no_streams_is_said_to_hold_no_streams(tmp_path, capsys):
    """A closed writer with no streams (or --recover keeping none) was described as "every step
    is empty or -1 padding": there are no steps at all."""
    path = tmp_path / "e.hst"
    with TraceWriter(path, k=4, source={}):
        pass
    code, out, err = run_cli(["trace", "validate", str(path)], capsys)
    assert code == 0 and "0 streams" in out and "no streams, nothing to replay" in out
    assert "padding" not in out
    code, out, err = run_cli(["trace", "info", str(path), "--json"], capsys)
    assert code == 0 and json.loads(out)["streams"] == 0
    assert "holds no streams: nothing to replay" in err and "padding" not in err


# -- compare ----------------------------------------------------------------------------------
def test_compare_refuses_a_k_whose_buffers_the_engine_cannot_hold(tmp_path, capsys):
    """k = 2**31 - 2 (the largest a trace may carry): B = 2k raised ValueError from the replay
    engine, a traceback with exit 1."""
    rows = [[0, 1, 2, t + 3] for t in range(40)]
    ctx = [t + 4 for t in range(40)]
    chunk = coded_chunk(rows, ctx, accesses=160, ctx_last=ctx[-1], steps=40, width=4)
    path = craft(tmp_path / "k.hst", json.dumps({"k": 2**31 - 2, "source": {}}).encode(), [chunk])
    code, out, err = run_cli(["trace", "compare", str(path)], capsys)
    assert code == 2 and out == ""
    assert "k = 2147483646 is too large to compare" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    # the same trace at a k the engine holds is compared
    small = craft(tmp_path / "s.hst", json.dumps({"k": 4, "source": {}}).encode(), [chunk])
    code, out, err = run_cli(["trace", "compare", str(small), "--json"], capsys)
    assert code == 0 and json.loads(out)["topk"] == 4


# -- gen: knobs at the edges of their ranges ---------------------------------------------------
def _gen(tmp_path, capsys, knobs: str, *extra: str) -> tuple[int, str]:
    kn = tmp_path / "k.toml"
    kn.write_text("[knobs]\n" + knobs + "\n")
    code, _, err = run_cli(["trace", "gen", "--knobs", str(kn), "--steps", "5", "--layers", "1", "--requests", "1",
                            "--topk", "256", "--ctx0", "2000", "--out", str(tmp_path / "g.hst"), "--quiet", *extra],
                           capsys)
    return code, err


@pytest.mark.parametrize("knobs", ["run_mean = 1e300", "run_mean = 1e9"])
def test_gen_with_a_huge_run_mean(tmp_path, capsys, knobs):
    """Runs were drawn whole before being cut to the context: 1e9 ran out of memory, 1e300
    overflowed (ValueError traceback)."""
    code, err = _gen(tmp_path, capsys, knobs)
    assert code == 0, err
    s = open_trace(tmp_path / "g.hst").read((0, 0))
    assert (s.counts == 256).all()


def test_gen_with_a_huge_zipf_alpha(tmp_path, capsys):
    """Every passage weight in reach underflowed to 0: NaN probabilities, a ValueError traceback
    (seed 1 here), and numpy's overflow warnings printed as hisparse warnings."""
    for seed in ("0", "1", "7"):
        code, err = _gen(tmp_path, capsys, "zipf_alpha = 1e308\nlocal_window = 500", "--seed", seed, "--topk", "1024")
        assert code == 0, err
        assert "overflow" not in err
        assert (open_trace(tmp_path / "g.hst").read((0, 0)).counts == 1024).all()


def test_gen_refuses_a_recall_draws_beyond_its_range(tmp_path, capsys):
    """recall_draws = 1e12 drew 1e12 candidates per recall: out of memory."""
    code, err = _gen(tmp_path, capsys, "recall_prob = 1.0\nrecall_draws = 1e12")
    assert code == 2 and "knob recall_draws = 1000000000000.0 must be <= 1024" in err
    assert not (tmp_path / "g.hst").exists()
    code, err = _gen(tmp_path, capsys, "recall_prob = 1.0\nrecall_spread = 1e6")  # infinite gaps: no warning
    assert code == 0 and "overflow" not in err


def test_cut_runs_draw_the_same_positions():
    """Cutting runs at the context's end keeps the positions the uncut runs give (the same
    random draws; only positions at or past hi were dropped, and still are)."""
    from simulator.trace.generator import GeneratorKnobs, _Popularity

    knobs = GeneratorKnobs(run_mean=400.0, passage_len=64)
    for seed in range(20):
        lo, hi = 4, 300
        rng = np.random.default_rng(seed)
        pop = _Popularity(knobs, 400, rng)
        state = rng.bit_generator.state
        got = pop.draw_runs(rng, lo, hi, 50, knobs.run_mean)
        rng.bit_generator.state = state  # the uncut draw, by hand
        n_passages = -(-hi // pop.passage_len)
        w = pop.weights[:n_passages]
        n_runs = max(1, int(np.ceil(50 / knobs.run_mean)) + 2)
        passage = rng.choice(n_passages, size=n_runs, p=w / w.sum())
        starts = passage * pop.passage_len + rng.integers(0, pop.passage_len, size=n_runs)
        lengths = rng.geometric(1.0 / knobs.run_mean, size=n_runs)
        pos = np.repeat(starts - np.cumsum(np.r_[0, lengths[:-1]]), lengths) + np.arange(lengths.sum())
        assert got.tolist() == pos[(pos >= lo) & (pos < hi)].tolist()


# -- an option that does not apply -------------------------------------------------------------
def test_recover_on_a_npy_gets_the_note_replay_gives(tmp_path, capsys):
    """--recover with a .npy array was silently ignored by the trace commands."""
    path = tmp_path / "t.npy"
    np.save(path, np.array([[0, 1], [0, 2]], np.int32))
    code, out, err = run_cli(["trace", "validate", str(path), "--recover"], capsys)
    assert code == 0 and "# --recover is unused: it applies to .hst traces" in err
    code, out, err = run_cli(["trace", "validate", str(path)], capsys)
    assert code == 0 and "unused" not in err
