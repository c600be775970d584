"""Random values for every option of the CLI: each is refused while parsing with one line naming
the option (exit 2), or it lies in its domain; and commands run on them exit 0 or 2 with one line
naming the option, never a traceback, never a changed input."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.cli import build_parser
from simulator.commands import common
from simulator.trace import TraceMeta, write_trace
from tests.fuzzing import assert_clean_error, fuzz_settings, run_cli
from tests.helpers import random_stream

JUNK = ["", " ", "x", "1.5", "1e3", "nan", "inf", "-inf", "-0", "0x10", "1_0", "٣", "--", "1,2", "2**8",
        str(2**31), str(2**63), str(10**30), str(-(2**63)), "0.0", "-1.5", "1e-300", "3 4"]


def values(small: bool = False):
    """Option values as a user might type them: integers around the edges, numbers, junk."""
    ints = st.integers(-5, 40) if small else st.one_of(st.integers(-5, 40), st.integers(-2**70, 2**70))
    return st.one_of(ints.map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                     st.sampled_from(JUNK), st.text(max_size=6))


def _subparsers(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, (*prefix, name))
    if prefix:
        yield prefix, parser


PARSER = build_parser()
COMMANDS = list(_subparsers(PARSER))
REQUIRED = {"--out": "o.hst", "--format": "oracle-general", "--model": "m", "--text": "t",
            "--prompt-tokens": "8", "--steps": "2", "--topk": "4"}
RANGED = {common.positive_int: lambda v: v >= 1, common.nonneg_int: lambda v: v >= 0,
          common.buffer_size: lambda v: 1 <= v <= common.MAX_BUFFER, common.seed_int: lambda v: 0 <= v < 2**63,
          common.positive_float: lambda v: v > 0 and math.isfinite(v),
          common.nonneg_float: lambda v: v >= 0 and math.isfinite(v)}


def _typed_options():
    for prefix, parser in COMMANDS:
        for action in parser._actions:
            if action.option_strings and action.type is not None:
                yield prefix, parser, action


def _base_argv(prefix, parser, skip):
    argv = list(prefix)
    for action in parser._actions:
        if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
            argv.append("x.hst")
        elif action.required and action.option_strings[0] != skip:
            argv += [action.option_strings[0], REQUIRED[action.option_strings[0]]]
    return argv


def test_no_option_uses_a_bare_int_or_float():
    """Every numeric option has a range (the types of commands/common.py)."""
    bare = [(" ".join(p), a.option_strings[0]) for p, _, a in _typed_options() if a.type in (int, float)]
    assert bare == []


@pytest.mark.parametrize("prefix, parser, action", list(_typed_options()),
                         ids=[" ".join(p) + " " + a.option_strings[0] for p, _, a in _typed_options()])
def test_option_values_parse_into_their_domain_or_are_refused(prefix, parser, action, capsys):
    option = action.option_strings[0]
    base = _base_argv(prefix, parser, option)

    @fuzz_settings(examples=15)
    @given(values())
    def prop(value):
        try:
            args = PARSER.parse_args([*base, f"{option}={value}"])
        except SystemExit as exc:
            err = capsys.readouterr().err
            assert_clean_error(exc.code, err, option)
            return
        got = getattr(args, action.dest)
        items = got if isinstance(got, list) else [got]
        assert items, (option, value)
        in_domain = RANGED.get(getattr(action.type, "item", action.type))
        if in_domain is not None:
            assert all(in_domain(item) for item in items), (option, value, got)
        # policies: check_policies, at run time; --accept-probs: a distribution, its values may repeat
        if isinstance(got, list) and option not in ("--policy", "--accept-probs"):
            assert len(set(got)) == len(got), (option, value)

    prop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny.hst"
    rng = np.random.default_rng(3)
    write_trace(path, TraceMeta(k=16, source={"kind": "test"}),
                [random_stream(rng, steps=30, k=16, ctx0=40, request=0, layer=j) for j in range(2)])
    return path


RUNS = [
    (["replay", "{t}", "--quiet", "--buffer"], True),
    (["replay", "{t}", "--quiet", "--buffer", "16", "--policy"], False),
    (["replay", "{t}", "--quiet", "--buffer", "16", "--policy", "random", "--seed"], False),
    (["replay", "{t}", "--quiet", "--buffer", "16", "--workers"], True),
    (["replay", "{t}", "--quiet", "--buffer", "16", "--plot", "{d}/p.png", "--window"], False),
    (["mrc", "{t}", "--quiet", "--max-buffer", "40", "--step"], True),
    (["mrc", "{t}", "--quiet", "--max-buffer", "40", "--min-buffer"], True),
    (["trace", "info", "{t}", "--sink"], False),
    (["trace", "info", "{t}", "--local"], False),
    (["trace", "export", "{t}", "--format", "oracle-general", "--out", "{d}/e.bin", "--layer"], False),
    (["trace", "gen", "--steps", "3", "--layers", "1", "--requests", "1", "--ctx0", "64", "--quiet",
      "--out", "{d}/g.hst", "--topk"], True),
    (["trace", "gen", "--steps", "3", "--layers", "1", "--requests", "1", "--topk", "8", "--quiet",
      "--out", "{d}/g.hst", "--ctx0"], True),
]


@pytest.mark.parametrize("template, small", RUNS, ids=[" ".join(t[:1] + t[-1:]) for t, _ in RUNS])
def test_commands_run_or_refuse_on_random_values(tiny, tmp_path, capsys, template, small):
    option = template[-1]
    base = [a.format(t=tiny, d=tmp_path) for a in template]
    before = tiny.read_bytes()

    @fuzz_settings(examples=10)
    @given(values(small=small))
    def prop(value):
        code, out, err = run_cli([*base, f"{option}={value}"], capsys)
        if code:
            assert_clean_error(code, err, option)
        else:
            assert out or list(tmp_path.iterdir()), (option, value)
        assert tiny.read_bytes() == before

    prop()
