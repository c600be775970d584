"""A preset file's keys that name another file (a deployment's gpu, hisparse and cluster, a cluster's
gpu) take a relative path from that file's own folder, as a GPU's ``calibration = "x.json"`` does:
``mydeploy/dep.toml`` with ``gpu = "gpu.toml"`` beside it loads from any working folder. Where no
such file is beside it, the working folder is looked in as before; a file in neither place is one
error naming the key, the deployment and both places. ``presets new`` rewrites these paths so that
a copy in another folder names the same files (``schema.FILE_RELATIVE_KEYS``)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from simulator.errors import HisparseError
from simulator.serving import presets as P
from simulator.serving import schema as S
from simulator.serving.scenario import load_scenario
from tests.fuzzing import assert_clean_error, run_cli
from tests.helpers import Reached

KEYS = pytest.mark.parametrize("key", ["gpu", "hisparse", "cluster"],
                               ids=lambda k: f"{k}_key")  # a bare "gpu" id is conftest's GPU-only marker


def _copy(kind: str, source: str, out: Path, **values) -> Path:
    """The shipped preset ``kind/source`` with top-level ``key = value`` lines replaced, written to ``out``."""
    text = (P.PRESET_DIR / kind / f"{source}.toml").read_text()
    for key, value in values.items():
        text, n = re.subn(rf"(?m)^{key} = .*$", f"{key} = {json.dumps(value)}", text, count=1)
        if not n:  # a key the shipped file leaves to its default
            head, sep, tables = text.partition("\n[")
            text = f"{head}\n{key} = {json.dumps(value)}\n{sep[1:]}{tables}" if sep else f"{text}\n{key} = {json.dumps(value)}\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def _deployment(folder: Path, **keys: str) -> Path:
    return _copy("deployments", "8xh200-colocated-dp8", folder / "dep.toml", **keys)


def _gpu(path: Path, name: str) -> Path:
    return _copy("gpus", "h200", path, name=name)


def _hisparse(path: Path, buffer: int) -> Path:
    return _copy("hisparse", "blog-8xh200", path, device_buffer_size=buffer)


def _cluster(path: Path, name: str, gpu: str) -> Path:
    return _copy("clusters", "2x8xh200-ib-ndr", path, name=name, gpu=gpu)


@pytest.fixture
def mine(tmp_path, monkeypatch) -> Path:
    """tmp/mine/dep.toml naming gpu.toml, hs.toml and cluster.toml beside it (the cluster naming the
    GPU file beside it too); the test runs from tmp/elsewhere, which holds none of them."""
    folder = tmp_path / "mine"
    _gpu(folder / "gpu.toml", "mine-gpu")
    _hisparse(folder / "hs.toml", 3072)
    _cluster(folder / "cluster.toml", "mine-cluster", "gpu.toml")
    _deployment(folder, gpu="gpu.toml", hisparse="hs.toml", cluster="cluster.toml")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return folder


DEP = "../mine/dep.toml"  # the deployment as the user names it from tmp/elsewhere


def _is_mine(sc) -> None:
    assert sc.gpu.name == "mine-gpu"
    assert sc.hisparse.device_buffer_size == 3072
    assert sc.cluster is not None and sc.cluster.name == "mine-cluster"


# -- read from the deployment's folder ------------------------------------------------------------------
def test_a_deployment_reads_the_files_beside_it_from_another_folder(mine):
    sc = load_scenario(deployment=DEP)
    _is_mine(sc)
    assert Path(sc.cluster.where).samefile(mine / "cluster.toml")
    assert Path(sc.hisparse.where).samefile(mine / "hs.toml")
    # the GPU's own calibration (a packaged name) still applies
    assert Path(sc.calibration).samefile(P.PRESET_DIR / "calibration" / "h200.json")


def test_hisparse_plan_reads_them_too(mine, capsys, monkeypatch):
    """Through the command: the scenario the simulation would start from holds the user's files."""
    import simulator.serving.planner as planner

    seen = []

    def stop(inp, *args, scenario=None, **kwargs):
        seen.append(scenario or inp.scenario())
        raise Reached

    monkeypatch.setattr(planner, "run_plan_full", stop)
    with pytest.raises(Reached):
        run_cli(["plan", "--deployment", DEP, "--no-search"], capsys)
    _is_mine(seen[0])


def test_the_copy_beside_wins_over_one_in_the_working_folder(mine):
    _gpu(Path("gpu.toml"), "cwd-gpu")
    _hisparse(Path("hs.toml"), 2048)
    assert load_scenario(deployment=DEP).gpu.name == "mine-gpu"
    assert load_scenario(deployment=DEP).hisparse.device_buffer_size == 3072


def test_files_only_in_the_working_folder_still_load(mine):
    """The fallback: a deployment written for the old rule (paths from the working folder) loads as before."""
    _gpu(Path("cwd-gpu.toml"), "cwd-gpu")
    _hisparse(Path("cwd-hs.toml"), 2048)
    _cluster(Path("cwd-cluster.toml"), "cwd-cluster", "cwd-gpu.toml")
    _deployment(mine, gpu="cwd-gpu.toml", hisparse="cwd-hs.toml", cluster="cwd-cluster.toml")
    sc = load_scenario(deployment=DEP)
    assert (sc.gpu.name, sc.hisparse.device_buffer_size, sc.cluster.name) == ("cwd-gpu", 2048, "cwd-cluster")


def test_one_file_beside_and_one_in_the_working_folder(mine):
    _hisparse(Path("cwd-hs.toml"), 2048)
    _deployment(mine, gpu="gpu.toml", hisparse="cwd-hs.toml", cluster="cluster.toml")
    sc = load_scenario(deployment=DEP)
    assert (sc.gpu.name, sc.hisparse.device_buffer_size, sc.cluster.name) == ("mine-gpu", 2048, "mine-cluster")


@KEYS
def test_a_file_in_neither_place_names_the_key_the_deployment_and_both_places(mine, key, capsys, no_simulation):
    _deployment(mine, **{"gpu": "gpu.toml", "hisparse": "hs.toml", "cluster": "cluster.toml", key: "missing.toml"})
    try:
        code, _, err = run_cli(["plan", "--deployment", DEP, "--no-search"], capsys)
    except Reached:
        pytest.fail("a deployment naming a missing file reached the simulation")
    assert_clean_error(code, err, f"{key} = 'missing.toml'", DEP, str(Path("../mine/missing.toml")),
                       str(Path.cwd() / "missing.toml"))


def test_a_preset_name_is_still_a_preset_name(mine):
    """``gpu = "h200"`` is the shipped H200, even with an h200.toml of the user's beside the deployment."""
    _gpu(mine / "h200.toml", "mine-h200")
    _deployment(mine, gpu="h200", hisparse="", cluster="")
    sc = load_scenario(deployment=DEP)
    assert sc.gpu.name == "h200" and sc.deployment.gpu == "h200"


SET = ["deployment.gpu=gpu.toml", "deployment.hisparse=''", "deployment.cluster=''"]


def test_a_set_value_is_a_path_from_the_working_folder(mine):
    """``--set deployment.gpu=FILE`` is typed in the working folder: read from there, not the deployment's."""
    with pytest.raises(HisparseError, match="gpu.toml: no such file") as exc:
        load_scenario(deployment=DEP, overrides=SET)
    assert "its folder" not in str(exc.value)
    _gpu(Path("gpu.toml"), "cwd-gpu")
    assert load_scenario(deployment=DEP, overrides=SET).gpu.name == "cwd-gpu"


def test_a_cluster_and_its_deployment_naming_one_gpu_file_agree(mine, monkeypatch):
    """The cluster's gpu is compared with the deployment's: one file, spelt from two folders, is one GPU."""
    monkeypatch.chdir(mine)
    sc = load_scenario(deployment="dep.toml", overrides=["deployment.cluster=../mine/cluster.toml"])
    assert sc.cluster.name == "mine-cluster" and sc.gpu.name == "mine-gpu"


def test_a_plan_grid_of_the_deployment_passes_the_sweeps_checks(mine, tmp_path, capsys, monkeypatch):
    import simulator.sweep.points as points
    import simulator.sweep.runner as runner
    from tests.helpers import reached

    monkeypatch.setattr(points, "run_point", reached)
    monkeypatch.setattr(runner, "run_point", reached)
    grid = Path("grid.toml")
    grid.write_text(f'kind = "plan"\n[fixed]\ndeployment = "{DEP}"\n[grid]\nseed = [1, 2]\n')
    with pytest.raises(Reached):  # past the grid checks, which load every point's scenario
        run_cli(["sweep", str(grid), "--out", "out", "--no-ray"], capsys)


# -- presets new / show -----------------------------------------------------------------------------
def test_presets_new_into_another_folder_names_the_same_files(mine, tmp_path, capsys, monkeypatch):
    code, _, err = run_cli(["presets", "new", "deployment", "--from", DEP, "--out", "../copy/dep.toml"], capsys)
    assert code == 0, err
    written = tomllib.loads((tmp_path / "copy" / "dep.toml").read_text())
    for key, name in (("gpu", "gpu.toml"), ("hisparse", "hs.toml"), ("cluster", "cluster.toml")):
        assert not Path(written[key]).is_absolute()
        assert (tmp_path / "copy" / written[key]).resolve().samefile(mine / name)
    monkeypatch.chdir(tmp_path)  # a third folder: the copy names them from its own
    _is_mine(load_scenario(deployment="copy/dep.toml"))


def test_presets_new_of_a_cluster_names_the_same_gpu_file(mine, tmp_path, capsys):
    code, _, err = run_cli(["presets", "new", "cluster", "--from", "../mine/cluster.toml", "--out", "c.toml"], capsys)
    assert code == 0, err
    value = tomllib.loads(Path("c.toml").read_text())["gpu"]
    assert Path(value).samefile(mine / "gpu.toml")


def test_presets_new_into_the_same_folder_and_show_keep_the_values_as_written(mine, capsys):
    code, _, err = run_cli(["presets", "new", "deployment", "--from", DEP, "--out", "../mine/dep2.toml"], capsys)
    assert code == 0, err
    written = tomllib.loads((mine / "dep2.toml").read_text())
    assert (written["gpu"], written["hisparse"], written["cluster"]) == ("gpu.toml", "hs.toml", "cluster.toml")
    code, out, err = run_cli(["presets", "show", "deployment", DEP], capsys)
    assert code == 0, err
    assert tomllib.loads(out)["gpu"] == "gpu.toml"


def test_a_copy_that_would_name_other_files_is_refused(mine):
    """``check_loads`` compares the files the two name: the source's text written elsewhere as it is
    names gpu.toml beside the copy (or in the working folder), not the one beside the source."""
    stale = S.new_preset("deployments", DEP)  # no out: the values as the source has them
    assert 'gpu = "gpu.toml"' in stale
    with pytest.raises(HisparseError, match="gpu"):
        S.check_loads("deployments", stale, "../copy/dep.toml", source=DEP)
    S.check_loads("deployments", stale, "../mine/other.toml", source=DEP)  # from mine/ the same files
    S.check_loads("deployments", S.new_preset("deployments", DEP, "../copy/dep.toml"), "../copy/dep.toml", source=DEP)


def test_every_key_that_names_a_preset_file_is_rebased():
    for kind, keys in P.NAMED_KEYS.items():
        assert set(keys) <= set(S.FILE_RELATIVE_KEYS[kind])
    assert S.FILE_RELATIVE_KEYS["deployments"] == ("gpu", "hisparse", "cluster")
    assert S.FILE_RELATIVE_KEYS["clusters"] == ("gpu",)


# -- the files a deployment names are inputs: no output may be written over them -------------------------
def _named_html(mine: Path, key: str) -> Path:
    """The deployment's ``key`` file copied to a name a report may take (``KEY.html``: a user's file of
    any name loads), the deployment naming the copy."""
    target = mine / f"{key}.html"
    target.write_bytes((mine / {"hisparse": "hs.toml", "cluster": "cluster.toml", "gpu": "gpu.toml"}[key]).read_bytes())
    text = (mine / "dep.toml").read_text()
    (mine / "dep.toml").write_text(re.sub(rf"(?m)^{key} = .*$", f'{key} = "{target.name}"', text, count=1))
    return target


@KEYS
def test_plan_refuses_a_report_over_a_file_the_deployment_names(mine, capsys, key, no_simulation):
    """plan's input-against-output check listed the deployment's GPU file but not its hisparse config or
    cluster: a --report naming one of them passed the check and the page replaced the user's file."""
    target = _named_html(mine, key)
    before = target.read_bytes()
    code, _, err = run_cli(["plan", "--deployment", DEP, "--report", str(target), "--quiet"], capsys)
    assert_clean_error(code, err, "--report", target.name)
    assert target.read_bytes() == before


@KEYS
def test_a_plan_grid_refuses_a_report_over_a_file_its_deployment_names(mine, capsys, key):
    """The sweep's input list held no file behind a point's deployment."""
    target = _named_html(mine, key)
    before = target.read_bytes()
    grid = Path("grid.toml")
    grid.write_text(f'kind = "plan"\n[fixed]\ndeployment = "{DEP}"\n[grid]\nseed = [1, 2]\n')
    code, _, err = run_cli(["sweep", str(grid), "--out", "out", "--report", str(target), "--no-ray"], capsys)
    assert_clean_error(code, err, "--report", target.name)
    assert target.read_bytes() == before


def test_a_cluster_naming_its_gpu_by_another_spelling_agrees(mine):
    """The cluster's gpu was compared with the deployment's as text: "./sub/../gpu.toml" against
    "gpu.toml", or the packaged h200's path against the name "h200", was refused as two GPUs."""
    (mine / "sub").mkdir()
    _cluster(mine / "cluster.toml", "mine-cluster", "./sub/../gpu.toml")
    assert load_scenario(deployment=DEP).cluster.name == "mine-cluster"
    _cluster(mine / "cluster.toml", "mine-cluster", str(P.resolve("gpus", "h200")))
    _deployment(mine, gpu="h200", hisparse="hs.toml", cluster="cluster.toml")
    assert load_scenario(deployment=DEP).gpu.name == P.load("gpus", "h200").name
    _cluster(mine / "cluster.toml", "mine-cluster", "h100")
    with pytest.raises(HisparseError, match="but the deployment's gpu is 'h200'"):
        load_scenario(deployment=DEP)
