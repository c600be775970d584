"""Cost per output token from a price table (issue #29 item 9)."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.serving.prices import HOURS_PER_MONTH, Prices, load_prices


def _plan(capsys, *extra):
    assert main(["plan", "--concurrency", "32", "--slo-ttft-s", "none", "--json", "--quiet", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_cost_per_million_output_tokens_from_gpu_hours_and_the_host_pool(capsys, tmp_path):
    report = _plan(capsys, "--price-gpu-hour", "3.5", "--price-host-gb-month", "5")
    gpus = report["scenario"]["layout"]["gpus"]
    host = report["scenario"]["memory_per_rank"]["hisparse"]["host_pool_bytes"] / 1e9
    for r in report["rows"]:
        pool = host if r["system"] == "hisparse" else 0.0
        assert r["host_pool_gb_per_gpu"] == pytest.approx(pool)
        per_h = gpus * 3.5 + gpus * pool * 5 / HOURS_PER_MONTH
        assert r["usd_per_hour"] == pytest.approx(per_h)
        assert r["usd_per_m_output_tokens"] == pytest.approx(per_h / (r["steady_tok_s_deployment"] * 3600) * 1e6)
    assert report["recommendation"]["choice"]["usd_per_m_output_tokens"] is not None
    assert report["prices"]["gpu_hour"] == 3.5
    # the same from a price table file
    table = tmp_path / "prices.toml"
    table.write_text('gpu_hour = 3.5\nhost_gb_month = 5\nsource = "example quote"\n')
    again = _plan(capsys, "--prices", str(table))
    assert [r["usd_per_m_output_tokens"] for r in again["rows"]] == [r["usd_per_m_output_tokens"] for r in report["rows"]]
    assert "example quote" in again["prices"]["source"]
    # no prices: the columns are there, empty
    assert all(r["usd_per_m_output_tokens"] is None for r in _plan(capsys)["rows"])


def test_cost_in_the_text_output(capsys):
    assert main(["plan", "--concurrency", "8", "--quiet", "--price-gpu-hour", "2"]) == 0
    text = capsys.readouterr().out
    assert "$/M out" in text and "per M output tokens" in text and "prices (--price-gpu-hour 2" in text


def test_a_huge_price_keeps_the_table_laid_out(capsys):
    """--price-gpu-hour at its largest keeps every column in place (1e300, allowed then, printed a 300-digit integer
    that pushed the band and found columns off the table; the column turns to powers of ten from 1e9)."""
    from simulator.commands.plan_text import _table_float
    from simulator.serving.prices import MAX_PRICE

    assert _table_float(5.04e301) == "5.04e+301" and _table_float(123.456) == "123.5" and _table_float(0.0317) == "0.0317"
    assert main(["plan", "--concurrency", "8", "--no-search", "--quiet", "--price-gpu-hour", f"{MAX_PRICE:g}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("conc"))
    cells = lines[header + 1].split()
    numbers = [float(c) for c in cells if c.replace(".", "", 1).replace("e+", "", 1).isdigit()]
    assert max(numbers) > 1e6 and max(len(x) for x in cells) < 12  # the $/M cell, millions per M tokens


@pytest.mark.parametrize("content, message", [
    ("gpu_hour = -1\n", "gpu_hour = -1 must be a number >= 0"),
    ("host_gb_month = 1\n", "missing key gpu_hour"),
    ("gpu_hour = 1\nfoo = 2\n", "unknown key(s) foo"),
    ("gpu_hour = 'x'\n", "gpu_hour = 'x' must be a number"),
    ("gpu_hour = [\n", "not valid TOML"),
])
def test_bad_price_tables_are_one_line_errors(tmp_path, capsys, content, message):
    table = tmp_path / "p.toml"
    table.write_text(content)
    assert main(["plan", "--concurrency", "1", "--quiet", "--prices", str(table)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_price_option_errors(capsys, tmp_path):
    assert main(["plan", "--quiet", "--price-host-gb-month", "5"]) == 2
    assert "--price-host-gb-month needs --price-gpu-hour" in capsys.readouterr().err
    assert main(["plan", "--quiet", "--price-gpu-hour", "-1"]) == 2
    assert "--price-gpu-hour: expected a non-negative number" in capsys.readouterr().err
    assert main(["plan", "--quiet", "--prices", str(tmp_path / "none.toml")]) == 2
    assert "none.toml: no such file" in capsys.readouterr().err
    with pytest.raises(Exception, match="both are 0"):
        Prices(0.0, 0.0)
    assert load_prices.__doc__


def test_a_one_token_workload_is_refused_and_small_rates_keep_their_digits(capsys):
    """output_tokens = 1 (the schema's >= 1) ran with NaN TPOT columns, 0 tok/s steady and "nothing meets the
    targets": refused, naming the file and why. At 2 tokens the recommendation printed "0 tok/s steady (0 per GPU)":
    three significant digits below 100."""
    from simulator.commands.plan_text import _rate

    assert main(["plan", "--concurrency", "1", "--quiet", "--set", "workload.output_tokens=1"]) == 2
    err = capsys.readouterr().err
    assert "output_tokens = 1: a plan needs at least 2 output tokens" in err and "32k-in-8k-out.toml" in err
    assert (_rate(0.254), _rate(65.24), _rate(522.4), _rate(0.0317)) == ("0.254", "65.2", "522", "0.0317")


@pytest.mark.parametrize("args, names", [
    (["--price-gpu-hour", "1e308"], ("--price-gpu-hour", "from 0 to 1e+06", "'1e308'")),  # printed $inf per M
    (["--price-gpu-hour", "1", "--price-host-gb-month", "2e6"], ("--price-host-gb-month", "from 0 to 1e+06")),
])
def test_an_absurd_price_is_refused(capsys, args, names):
    from tests.fuzzing import assert_clean_error, run_cli

    code, out, err = run_cli(["plan", "--concurrency", "1", "--quiet", *args], capsys)
    assert_clean_error(code, err, *names)
    assert out == ""


def test_a_price_table_past_the_bound_is_refused_and_every_cost_at_it_is_finite(tmp_path, capsys):
    import math

    from simulator.serving.prices import MAX_PRICE

    table = tmp_path / "p.toml"
    table.write_text("gpu_hour = 1e308\n")
    assert main(["plan", "--concurrency", "1", "--quiet", "--prices", str(table)]) == 2
    err = capsys.readouterr().err
    assert f"{table}: gpu_hour = 1e+308 must be at most 1e+06" in err and err.count("\n") == 1
    p = Prices(MAX_PRICE, MAX_PRICE)
    per_h = p.usd_per_hour(8, 1e12)  # 8 GPUs, 1 TB pinned each
    assert math.isfinite(per_h) and math.isfinite(per_h / (1e-3 * 3600) * 1e6)  # even at 0.001 tok/s
