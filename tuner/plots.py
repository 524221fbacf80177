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


def peers_figure(docs: list[dict[str, Any]], title: str):
    """Energy saving over the whole run (tuning included) against training time relative to
    stock, one panel per run (card x workload), one point per peer, the budget as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(docs), figsize=(4.2 * len(docs), 4), squeeze=False)
    for ax, doc in zip(axes[0], docs):
        for i, (name, p) in enumerate(doc["peers"].items()):
            ax.scatter(100 * p["slowdown"], 100 * p["energy_saving"], color=f"C{i}", label=name, zorder=3)
            paper = p.get("as_paper_ran_it")
            if paper is not None:
                ax.scatter(
                    100 * paper["slowdown"],
                    100 * paper["energy_saving"],
                    facecolors="none",
                    edgecolors=f"C{i}",
                    label=f"{name} (switches ignored)",
                    zorder=3,
                )
        ax.axvline(100 * doc["budget"], color="k", ls=":", lw=1, label="budget")
        ax.axhline(0.0, color="grey", lw=0.6)
        ax.set_xlabel("training time vs stock (%)")
        ax.set_ylabel("energy saving over the whole run (%)")
        ax.set_title(f"{doc['gpu']}, {doc['workload']}, {doc['steps']:,} steps [simulated]", fontsize=8)
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig
