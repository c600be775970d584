"""Shared set-up of the property-based suites: bounded examples in CI, more on request.

``HISPARSE_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz_*.py`` runs each property with
that many examples; ``HISPARSE_FUZZ_FACTOR=10`` with ten times its CI count. Examples are derandomised (the same inputs every run) and no example database
is written, so the suites stay deterministic.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("HISPARSE_FUZZ_EXAMPLES", "0") or 0)
FACTOR = max(1, int(os.environ.get("HISPARSE_FUZZ_FACTOR", "1") or 1))


def fuzz_settings(ci_examples: int):
    """Hypothesis settings: ``ci_examples`` by default (times HISPARSE_FUZZ_FACTOR), HISPARSE_FUZZ_EXAMPLES when set."""
    return settings(max_examples=EXAMPLES or ci_examples * FACTOR, deadline=None, derandomize=True, database=None,
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
