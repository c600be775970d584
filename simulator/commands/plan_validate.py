"""``hisparse plan --validate``: the serving model run on published sets, measured against predicted."""

from __future__ import annotations

import argparse
import json

from .common import json_safe, print_json

VALIDATE_FILES = ("validation.csv", "validation.json", "validation.png")


# -- validation against published runs ------------------------------------------------------------
def run_validate(args: argparse.Namespace) -> int:
    from ..progress import counter
    from ..serving.published import error_text, load_published, published_names, summary, validate

    names = published_names() if args.validate == "all" else [args.validate]
    # --trace and --calibration apply to every set (e.g. re-run the validation on another trace)
    overrides = {k: v for k, v in (("trace", args.trace), ("calibration", args.calibration))
                 if v is not None and v != "auto"}
    sets = [load_published(n) for n in names]
    total = sum(len(s.points) for s in sets)
    tick = counter(total, desc="published points", quiet=args.quiet, unit="pt")
    rows: list[dict] = []
    per_set = {}
    for s in sets:
        set_rows = validate(s, on_point=tick, seed=args.seed, overrides=overrides)
        rows += set_rows
        per_set[s.name] = summary(set_rows) | {"source": s.source, "uncertainty": s.uncertainty, "file": s.where}
    report = json_safe({"sets": per_set, "all": summary(rows), "rows": rows})  # NaN -> null; notes say why
    from ..fileio import output_set

    with output_set():  # --out's folder and --report's page together
        if args.out:  # the three files swapped into --out as one set (fileio.folder_output)
            import pandas as pd

            from ..fileio import atomic_output, folder_output
            from .plan import out_files

            with folder_output(args.out, out_files()) as staged:  # the other modes' files go (plan.out_files)
                with atomic_output(staged / "validation.csv") as fh:
                    fh.write(pd.DataFrame(rows).to_csv(index=False).encode())
                with atomic_output(staged / "validation.json") as fh:
                    fh.write(json.dumps(report, indent=2, default=str, allow_nan=False).encode())
                from ..serving.plots import plot_validation

                plot_validation(rows, str(staged / "validation.png"))
        if args.report:
            from ..report.validate_html import write_validation_report

            write_validation_report(report, args.report)
    if args.json:
        print_json(report)
        return 0
    import pandas as pd

    for s in sets:
        info = per_set[s.name]
        print(f"== {s.name}: {s.source}")
        if s.uncertainty:
            print(f"   uncertainty: {s.uncertainty}")
        df = pd.DataFrame([r for r in rows if r["set"] == s.name])
        df["error"] = df["error"].map(lambda e: "n/a" if e != e else f"{e:+.0%}")
        print(df[["label", "metric", "measured", "predicted", "error", "at_concurrency"]].to_string(
            index=False, float_format=lambda v: f"{v:.1f}"))
        print(f"   {error_text(info)}"
              + (f" ({info['estimates']} estimate(s) reported, not in the median)" if info["estimates"] else ""))
        for r in rows:
            if r["set"] == s.name and (r["note"] or r["kind"] != "measurement"):
                kind = " [ESTIMATE, not a measurement]" if r["kind"] != "measurement" else ""
                print(f"   {r['label']}{kind}: {r['note']}")
        print()
    a = summary(rows)
    print(f"all sets: {error_text(a, 'measured points')}"
          + (f", {a['estimates']} estimate(s) apart" if a["estimates"] else "")
          + " (no model term is fitted to these runs)")
    return 0
