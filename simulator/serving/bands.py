"""Error bands: each prediction carries the validation error of the published set closest to it.

The band of a predicted throughput is the median |error| of the measured points of the published
set (``hisparse plan --validate``) that is nearest to the scenario: the same model family first,
then the same GPU, then the same deployment kind (mode and attention layout), then the same system
(baseline or HiSparse; a set's points of the other system when it has none of this one). The band
says which set it is and what matches, and carries the set's largest |error| too. TPOT and ITL take
the same band (at a steady running set TPOT = running requests / decode throughput, so their
relative errors are equal). TTFT has its own band, from the sets' measured TTFT points only (a
queueing figure errs differently from a rate): ``ttft_band``, None where no set measured TTFT.

The validation takes ~8 s (2 shared cores), too long for every plan, so its per-set errors are kept in
``simulator/presets/published/bands.json``, written by ``python -m simulator.serving.bands`` from
``--validate all`` (a slow test re-runs it and checks the file is current). No model term is fitted
to these runs: they only size the band.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from ..errors import HisparseError
from .slo import BANDS_FILE


def family(model_name: str) -> str:
    """'glm-5.1-fp8-kvfp8' -> 'glm-5.1': the model with its weight and KV formats dropped."""
    parts = model_name.split("-")
    return "-".join(parts[:2])


def compute_bands(sets: list, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per published set: what it ran (model, GPU, deployment kind) and per system the median and
    largest |error| over its measured points (estimates left out, as ``published.summary`` does)."""
    from .scenario import load_scenario

    out: dict[str, Any] = {}
    for s in sets:
        sc = load_scenario(**dict(s.scenario))
        d = sc.deployment
        per: dict[str, Any] = {}
        ttft: dict[str, Any] = {}
        for system in ("baseline", "hisparse"):
            kept = [r for r in rows if r["set"] == s.name and r["system"] == system
                    and r.get("kind", "measurement") == "measurement" and r["error"] is not None
                    and not math.isnan(r["error"]) and r["metric"] != "max_running"]
            for group, want in ((per, False), (ttft, True)):
                errs = [abs(r["error"]) for r in kept if str(r["metric"]).startswith("ttft") == want]
                if errs:
                    group[system] = {"median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                                     "points": len(errs), "abs_errors": sorted(errs)}
        out[s.name] = {"model": sc.model.name, "family": family(sc.model.name), "gpu": sc.gpu.name,
                       "deployment": d.name, "mode": d.mode.value, "attention": d.attention.value,
                       "systems": per, "ttft": ttft}
    return out


def write_bands(path: Path = BANDS_FILE) -> dict[str, Any]:
    """Run every shipped published set (``hisparse plan --validate all``) and write the bands file."""
    from ..fileio import atomic_output
    from .published import load_published, published_names, validate

    sets = [load_published(n) for n in published_names()]
    rows = [r for s in sets for r in validate(s)]
    bands = compute_bands(sets, rows)
    doc = {"written_by": "python -m simulator.serving.bands (hisparse plan --validate all, seed 0)",
           "sets": bands}
    with atomic_output(path) as fh:
        fh.write((json.dumps(doc, indent=2, sort_keys=True) + "\n").encode())
    return doc


def load_bands(path: Path = BANDS_FILE) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
        sets = doc["sets"]
        if not isinstance(sets, dict):
            raise TypeError("sets is not a table")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HisparseError(f"{path}: cannot read the validation bands ({exc}); rewrite it with "
                            "python -m simulator.serving.bands") from None
    return sets


def band_for(model_name: str, gpu_name: str, mode: str, attention: str, system: str,
             bands: dict[str, Any] | None = None, group: str = "systems") -> dict[str, Any] | None:
    """The nearest published sets' band for a prediction (module docstring), or None without sets:
    the median |error| over the pooled points of every set equally near (one reading of a setup is
    not preferred over another's: #30985 and the paper disagree for the same flags). ``group``
    "systems": throughputs, TPOT and ITL; "ttft": the sets' TTFT points."""
    bands = load_bands() if bands is None else bands
    scored = []
    for name, s in sorted(bands.items()):
        s = dict(s, systems=s.get(group) or {})
        if not s["systems"]:
            continue
        same = {"model family": s["family"] == family(model_name), "GPU": s["gpu"] == gpu_name,
                "deployment kind": (s["mode"], s["attention"]) == (mode, attention),
                "system": system in s["systems"]}
        scored.append((tuple(same.values()), name, s, same))
    if not scored:
        return None
    top = max(k for k, *_ in scored)
    near = [(name, s, same) for k, name, s, same in scored if k == top]
    errs: list[float] = []
    for _, s, _ in near:
        stats = s["systems"].get(system) or max(s["systems"].values(), key=lambda v: v["points"])
        errs += stats["abs_errors"]
    same = near[0][2]
    matches = [k for k, v in same.items() if v]
    differs = [k for k, v in same.items() if not v]
    names = [n for n, _, _ in near]
    how = (f"published set{'s' if len(near) > 1 else ''} {' + '.join(names)} ("
           + "; ".join(f"{s['model']}, {s['gpu']}, {s['mode']} {s['attention'].upper()} attention" for _, s, _ in near)
           + f"), {len(errs)} points: same {', '.join(matches) if matches else 'nothing'}"
           + (f"; differs in {', '.join(differs)} (the band may understate the error)" if differs else ""))
    return {"band": statistics.median(errs), "max": max(errs), "points": len(errs), "set": " + ".join(names),
            "matches": matches, "differs": differs, "how": how}


def band_for_scenario(sc, system: str, bands: dict[str, Any] | None = None,
                      group: str = "systems") -> dict[str, Any] | None:
    d = sc.deployment
    return band_for(sc.model.name, sc.gpu.name, d.mode.value, d.attention.value, system, bands, group)


def main(argv: list[str] | None = None) -> int:
    """``python -m simulator.serving.bands``: re-run the validation and rewrite the bands file (a
    maintainer's step after a model change); it takes no arguments, so any given is refused before
    the file is touched."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m simulator.serving.bands",
                                 description="Re-run `hisparse plan --validate all` and rewrite the error bands "
                                             f"file {BANDS_FILE} from its per-set errors (~8 s).")
    ap.parse_args(sys.argv[1:] if argv is None else argv)
    doc = write_bands()
    for name, s in doc["sets"].items():
        print(name, json.dumps(s["systems"]))
    print(f"wrote {BANDS_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
