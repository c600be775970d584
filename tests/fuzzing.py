"""Shared set-up of the property-based suites: two tiers of examples, more on request.

The number of examples comes from the hypothesis profile named by ``HYPOTHESIS_PROFILE``
(registered in ``tests/conftest.py``):

- ``ci`` (the default, ``python -m pytest``): each property runs a fifth of its full count
  (at least 5 examples), so the default tier stays within its time budget;
- ``slow`` (``HYPOTHESIS_PROFILE=slow python -m pytest -m slow``): each property runs its full
  count, the one written beside it (``fuzz_settings(examples=...)``), and every property test
  is also put in the slow tier, so ``-m slow`` selects it.

``HISPARSE_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz_*.py`` runs each property with
that many examples whatever the profile; ``HISPARSE_FUZZ_FACTOR=10`` runs ten times the profile's
count. Examples are derandomised (the same inputs every run) and no example database is written,
so the suites stay deterministic.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("HISPARSE_FUZZ_EXAMPLES", "0") or 0)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci") or "ci"
PROFILES = ("ci", "slow")
if PROFILE not in PROFILES:
    raise RuntimeError(f"HYPOTHESIS_PROFILE={PROFILE!r}: expected one of {', '.join(PROFILES)}")
CI_SHARE = 5  # the ci profile runs 1 / CI_SHARE of each property's full count
FACTOR = max(1, int(os.environ.get("HISPARSE_FUZZ_FACTOR", "1") or 1))


def examples_for(examples: int) -> int:
    """How many examples a property with ``examples`` (its full count) runs under this profile
    (times HISPARSE_FUZZ_FACTOR)."""
    if EXAMPLES:
        return EXAMPLES
    return FACTOR * (examples if PROFILE == "slow" else max(5, -(-examples // CI_SHARE)))


def fuzz_settings(examples: int | None = None, *, ci_examples: int | None = None):
    """Hypothesis settings: ``examples`` under the slow profile, a fifth of it under ci (the
    default), HISPARSE_FUZZ_EXAMPLES when set. ``ci_examples`` instead names the ci count (the slow
    profile runs ``CI_SHARE`` times it)."""
    if (examples is None) == (ci_examples is None):
        raise TypeError("fuzz_settings takes examples or ci_examples")
    full = examples if examples is not None else ci_examples * CI_SHARE
    return settings(max_examples=examples_for(full), deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Run the CLI in this process: (exit status, stdout, stderr). Any exception other than
    SystemExit escapes: a traceback fails the property."""
    from simulator.cli import main

    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: --help or a parse error
        code = exc.code
    out, err = capsys.readouterr()
    return int(code or 0), out, err


def assert_clean_error(code: int, err: str, *names: str) -> None:
    """Exit 2 with exactly one error line (beside any ``hisparse: warning:`` lines), naming every
    one of ``names``."""
    assert code == 2, (code, err)
    lines = [line for line in err.strip().splitlines() if not line.startswith("hisparse: warning:")]
    assert len(lines) == 1, err
    assert "error:" in lines[0] and "Traceback" not in err, err
    for name in names:
        assert name in lines[0], (name, err)
