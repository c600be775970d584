"""What-if overrides (``--set``) applied after the calibration, the preset schema and ``presets new``
(issue #29 item 5)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simulator.cli import main
from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving.scenario import load_scenario, parse_override
from simulator.serving.schema import new_preset, schema


def _plan(capsys, *extra):
    assert main(["plan", "--concurrency", "64", "--slo-ttft-s", "none", "--json", "--quiet", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_halving_link_bw_with_set_moves_the_hisparse_answer(capsys):
    base = load_scenario()
    half = base.gpu.link_bw / 2  # the calibrated figure, not the GPU file's
    assert base.gpu.link_bw != P.load("gpus", "h200").link_bw
    a = _plan(capsys)
    b = _plan(capsys, "--set", f"gpu.link_bw={half!r}")
    ha, hb = a["recommendation"]["hisparse"], b["recommendation"]["hisparse"]
    assert hb["steady_tok_s_deployment"] < ha["steady_tok_s_deployment"]  # computed: slower swap-in
    assert hb["tpot_p99_ms"] > ha["tpot_p99_ms"]
    base_rows = [[r["steady_tok_s_deployment"] for r in x["rows"] if r["system"] == "baseline"] for x in (a, b)]
    assert base_rows[0] == base_rows[1]  # the baseline never swaps in
    notes = b["scenario"]["notes"]
    assert any(n.startswith(f"--set gpu.link_bw={half!r}: link_bw") and "replaces the calibrated" in n for n in notes)
    assert b["scenario"]["overrides"] == [f"--set gpu.link_bw={half!r}"]


def test_set_applies_after_the_calibration_and_to_every_kind():
    sc = load_scenario(overrides=["gpu.link_bw=27.5e9", "deployment.host_bytes=1e12", "hisparse.device_buffer_size=6144",
                                  "hisparse.host_to_device_ratio=4", "hisparse.policy=lru", "workload.output_tokens=1024",
                                  "model.context_length=131072"])
    assert sc.gpu.link_bw == 27.5e9 and sc.deployment.host_bytes == 1e12
    assert (sc.hisparse.device_buffer_size, sc.hisparse.host_to_device_ratio) == (6144, 4.0)
    assert sc.workload.output_tokens == 1024 and sc.model.context_length == 131072
    assert isinstance(sc.hisparse.device_buffer_size, int)
    # a deployment's gpu is read after its override
    assert load_scenario(overrides=["deployment.gpu=b200"]).gpu.name == "b200"


@pytest.mark.parametrize("text, message", [
    ("gpu.nope=1", "--set gpu.nope=1: gpu.nope: unknown key (keys: name, hbm_bytes"),
    ("foo.x=1", "unknown kind 'foo'"),
    ("gpu.link_bw", "expected KIND.KEY=VALUE"),
    ("hisparse.policy=", "--set hisparse.policy=: an empty value (give hisparse.policy=VALUE"),
    ("gpu.link_bw=fast", "gpu.link_bw takes a number, got 'fast'"),
    ("hisparse.device_buffer_size=4096.5", "takes a whole number"),
    ("gpu.interconnect=1", "a table: edit the file"),
    ("gpu.link_bw=-1", "with --set gpu.link_bw=-1: link_bw = -1.0 must be > 0"),
    ("hisparse.device_buffer_size=1000", "device_buffer_size 1000 < top_k 2048"),
    ("deployment.attention=xx", "attention = 'xx': must be one of dp, tp"),
    ("workload.ignore_eos=2", "takes true or false"),
    # a whole number past 2**53 overflowed the weights' float arithmetic (OverflowError, a traceback)
    ("model.experts=1e300", "experts = 1e+300: must be at most 2**53 (9,007,199,254,740,992)"),
    ("deployment.gpus=1e300", "gpus = 1e+300: must be at most 2**53"),
    ("hisparse.device_buffer_size=99999999999999999", "device_buffer_size = 1.000e+17: must be at most 2**53"),
    ("model.attention_heads=" + "9" * 400, "attention_heads = an integer of 400 digits: must be at most 2**53"),
])
def test_bad_set_is_one_line_exit_2(capsys, text, message):
    assert main(["plan", "--concurrency", "1", "--quiet", "--set", text]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_set_twice_and_with_validate_are_refused(capsys):
    assert main(["plan", "--quiet", "--set", "gpu.link_bw=1e9", "--set", "gpu.link_bw=2e9"]) == 2
    assert "--set gpu.link_bw is given twice" in capsys.readouterr().err
    assert main(["plan", "--validate", "all", "--quiet", "--set", "gpu.link_bw=1e9"]) == 2
    assert "--set" in capsys.readouterr().err
    with pytest.raises(HisparseError):
        parse_override("=1")


@pytest.mark.parametrize("kind", ["models", "gpus", "deployments", "workloads", "hisparse", "calibration"])
def test_schema_lists_every_field_with_its_type(kind, capsys):
    keys = {k.name: k for k in schema(kind)}
    fields = {f.name for f in dataclasses.fields(P.KINDS[kind])} - {"where"}
    assert set(keys) == fields
    assert all(k.type for k in keys.values())
    if kind in ("gpus", "models", "hisparse", "workloads"):
        numeric = [k for k in keys.values() if k.type in ("number", "integer")]
        assert all(k.meaning for k in numeric), [k.name for k in numeric if not k.meaning]
    assert main(["presets", "--schema", kind]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in keys)


def test_schema_units_and_defaults(capsys):
    keys = {k.name: k for k in schema("gpu")}
    assert keys["link_bw"].unit == "bytes/s" and keys["link_bw"].required and keys["link_bw"].domain == "> 0"
    assert not keys["gpus_per_node"].required and keys["gpus_per_node"].default == 8
    assert main(["presets", "--schema", "gpus", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "gpus" and any(k["name"] == "interconnect" and k["type"] == "table" for k in doc["keys"])


@pytest.mark.parametrize("kind", ["models", "gpus", "deployments", "workloads", "hisparse"])
def test_presets_new_writes_complete_files_that_load_back(kind, tmp_path, capsys):
    for name in P.preset_names(kind):
        out = tmp_path / f"{name}.toml"
        assert main(["presets", "new", kind, "--from", name, "--out", str(out)]) == 0
        assert f"wrote {out}" in capsys.readouterr().out
        text = out.read_text()
        assert P.load(kind, str(out)) == P.load(kind, name)
        written = P.read_toml(out)
        assert {k.name for k in schema(kind)} - {"sources"} <= set(written)  # every key, defaults included
        assert text.count("# ") >= len(written)  # commented


def test_presets_new_gpu_file_plans_like_its_source(tmp_path, capsys):
    out = tmp_path / "my.toml"
    assert main(["presets", "new", "gpu", "--from", "h200", "--out", str(out)]) == 0
    capsys.readouterr()
    assert load_scenario(gpu=str(out)).gpu == load_scenario().gpu
    assert main(["presets", "new", "gpu", "--from", "h200"]) == 2
    assert "give --out" in capsys.readouterr().err
    assert f"use it as --gpu {out} " in _new(tmp_path, "gpus", "h200", capsys)


def _new(tmp_path, kind: str, name: str, capsys) -> str:
    out = tmp_path / f"new-{name}.toml"
    assert main(["presets", "new", kind, "--from", name, "--out", str(out)]) == 0
    return capsys.readouterr().out.replace(f"new-{name}.toml", "my.toml")


def test_presets_new_cluster_says_the_set_argument_that_uses_it(tmp_path, capsys):
    """A cluster is a deployment key: the hint was '--set deployment.cluster= c.toml', which the shell splits
    into two arguments (unrecognized arguments: c.toml); the argument has no space, and it plans."""
    text = _new(tmp_path, "clusters", "2x8xh200-roce", capsys)
    path = tmp_path / "new-2x8xh200-roce.toml"
    assert f"use it as --set deployment.cluster={tmp_path / 'my.toml'} " in text
    assert main(["plan", "--quiet", "--no-search", "--concurrency", "1", "--nodes", "2",
                 "--set", f"deployment.cluster={path}"]) == 0
    assert main(["presets", "new", "gpu", "--from", "h200", "--out", str(tmp_path / "x.txt")]) == 2
    assert "use a .toml file name" in capsys.readouterr().err
    assert main(["presets", "--schema", "nope"]) == 2
    assert "unknown preset kind 'nope'" in capsys.readouterr().err
    assert new_preset("gpus", "b200").count("[interconnect]") == 1


def test_presets_new_refuses_to_overwrite_the_preset_it_copies(tmp_path, monkeypatch, capsys):
    """--from h200 --out <the h200 preset's own file> overwrote it (rc 0) while --from g1.toml --out g1.toml was
    refused: the name is resolved to its file before the output check. On a copy of the preset folder."""
    import hashlib
    import shutil

    from tests.fuzzing import assert_clean_error, run_cli

    shipped = P.resolve("gpus", "h200")
    digest = hashlib.sha256(shipped.read_bytes()).hexdigest()
    copy = tmp_path / "presets"
    shutil.copytree(P.PRESET_DIR / "gpus", copy / "gpus")
    monkeypatch.setattr(P, "PRESET_DIR", copy)
    target = copy / "gpus" / "h200.toml"
    assert P.resolve("gpus", "h200") == target
    before = target.read_bytes()
    for kind in ("gpu", "gpus"):
        code, out, err = run_cli(["presets", "new", kind, "--from", "h200", "--out", str(target)], capsys)
        assert_clean_error(code, err, str(target), "is an input of this command")
        assert out == "" and target.read_bytes() == before
    # the control: the same name into another file writes it
    code, out, _ = run_cli(["presets", "new", "gpu", "--from", "h200", "--out", str(tmp_path / "mine.toml")], capsys)
    assert code == 0 and (tmp_path / "mine.toml").is_file()
    # a name that does not resolve is the command's own error, not the output check's
    code, _, err = run_cli(["presets", "new", "gpu", "--from", "nosuch", "--out", str(tmp_path / "x.toml")], capsys)
    assert_clean_error(code, err, "unknown gpu preset 'nosuch'")
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == digest


def test_presets_new_refuses_json(tmp_path, capsys):
    """--json with new was silently ignored (the usual text line printed, rc 0)."""
    from tests.fuzzing import assert_clean_error, run_cli

    out = tmp_path / "g.toml"
    code, printed, err = run_cli(["presets", "new", "gpu", "--from", "h200", "--out", str(out), "--json"], capsys)
    assert_clean_error(code, err, "--json", "presets new")
    assert printed == "" and not out.exists()


@pytest.mark.parametrize("layout", ["inline", "dotted"])
def test_presets_new_keeps_sources_and_interconnect_given_without_table_headers(layout, tmp_path, capsys):
    """A GPU file whose sources is an inline table (or whose interconnect is dotted keys) loads with --gpu, but
    presets new copied only the text from the first [table] line: the sources were dropped silently (rc 0,
    'loads back as it is' false), and dotted interconnect keys were refused ('no [interconnect] table')."""
    import tomllib

    from simulator.serving.schema import _toml_value

    shipped = P.resolve("gpus", "h100").read_text()
    data = tomllib.loads(shipped)
    head = shipped.partition("\n[sources]\n")[0]
    if layout == "inline":
        extra = [f"sources = {_toml_value(data['sources'])}", "[interconnect]",
                 *(f"{k} = {_toml_value(v)}" for k, v in data["interconnect"].items())]
    else:
        extra = [f"{table}.{k} = {_toml_value(v)}" for table in ("sources", "interconnect")
                 for k, v in data[table].items()]
    src = tmp_path / "mine.toml"
    src.write_text(head + "\n" + "\n".join(extra) + "\n")
    out = tmp_path / "copy.toml"
    assert main(["presets", "new", "gpu", "--from", str(src), "--out", str(out)]) == 0
    capsys.readouterr()
    copy, mine = P.load("gpus", str(out)), P.load("gpus", str(src))
    assert dataclasses.replace(copy, where="") == dataclasses.replace(mine, where="")
    assert dict(copy.sources) == dict(mine.sources) == data["sources"]  # sources: compare=False in the spec
