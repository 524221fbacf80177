"""The peers' figure of docs/benchmarks.md (docs/peers.png): rows of `kdvfs peers --json`
in one plot, saved as PNG and logged to MLflow; prints the rows as JSON.

    python -m kdvfs.experiments.peers_figure ROW.json ... --out docs/peers.png [--mlflow-uri URI]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kdvfs.tuner.plots import peers_figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdvfs.experiments.peers_figure")
    parser.add_argument("rows", nargs="+", type=Path, help="JSON documents of `kdvfs peers`")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--mlflow-uri", default=None, help="log the figure to this tracking URI too")
    args = parser.parse_args(argv)
    docs = [json.loads(p.read_text()) for p in args.rows]
    fig = peers_figure(
        docs, "energy saving over the whole run (tuning included) vs training time [simulated]"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    rows = {
        f"{d['device']} {d['workload']}": {
            n: {k: p[k] for k in ("energy_saving", "slowdown")} for n, p in d["peers"].items()
        }
        for d in docs
    }
    if args.mlflow_uri is not None:
        from kdvfs.tuner.tracking import Tracker

        with Tracker(args.mlflow_uri, experiment="kdvfs-peers").start_run(
            "peers-figure", {"rows": len(docs)}
        ) as run:
            run.log_figure(fig, "peers.png")
            run.log_dict(rows, "rows.json")
        rows["mlflow"] = run.url_or_path  # type: ignore[assignment]
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
