"""Figures the tuner logs and the experiments save (matplotlib, no display needed)."""

from __future__ import annotations

from typing import Any


def convergence_figure(results: dict[str, list[dict[str, Any]]], sweep: dict[str, Any], title: str):
    """Plan's energy saving against measurements, one line per strategy (median over seeds
    at each seed's points), the full sweep as the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, runs in results.items():
        for i, run in enumerate(runs):
            xs, ys = zip(*run["curve"])
            ax.plot(
                xs,
                [100 * y for y in ys],
                color=f"C{list(results).index(name)}",
                alpha=0.8,
                label=name if i == 0 else None,
                lw=1.2,
            )
    ax.axhline(100 * sweep["energy_saving"], color="k", ls="--", lw=1, label="full sweep")
    ax.axvline(sweep["measurements"], color="k", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("measurements (log)")
    ax.set_ylabel("plan's energy saving (%)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
