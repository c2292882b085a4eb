"""Plot a soak's samples (scripts/soak.sh): one panel per series, the last two thirds shaded."""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SERIES = [
    ("rss_mib", "tally RSS (MiB)"),
    ("fds", "tally open files"),
    ("redis_clients", "Redis clients"),
    ("redis_mib", "Redis used memory (MiB)"),
    ("keys", "Redis keys"),
]


def main(src, dst):
    with open(src) as f:
        rows = list(csv.DictReader(f))
    t = [float(r["t_s"]) / 60 for r in rows]
    fig, axes = plt.subplots(len(SERIES), 1, figsize=(8, 10), sharex=True)
    for ax, (name, label) in zip(axes, SERIES):
        ys = [float(r[name]) for r in rows]
        ax.plot(t, ys, lw=1)
        ax.set_ylabel(label, fontsize=8)
        ax.set_ylim(0, max(ys + [1.0]) * 1.15)
        if t:
            ax.axvspan(t[len(t) // 3], t[-1], color="0.92", zorder=0)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes (shaded: the part the verdict's slopes are measured on)")
    fig.suptitle("tally soak: 1-minute windows on the stream + request path", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=90)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
