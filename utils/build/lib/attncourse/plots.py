"""Figures shared by the chapters."""
import matplotlib.pyplot as plt


def attention_heatmap(weights, row_labels=None, col_labels=None, title=None, ax=None, cmap="viridis"):
    """Draw a [queries, keys] weight matrix; rows are queries (who looks), columns keys (who is looked at)."""
    w = weights.detach().cpu().float().numpy() if hasattr(weights, "detach") else weights
    if w.ndim != 2:
        raise ValueError(f"attention_heatmap draws one [queries, keys] matrix, got shape {list(w.shape)}: "
                         "select one batch element and head first, e.g. weights[0, 0]")
    if ax is None:
        fig, ax = plt.subplots(figsize=(0.45 * w.shape[1] + 2.5, 0.45 * w.shape[0] + 1.5))
    else:
        fig = ax.figure
    im = ax.imshow(w, cmap=cmap, vmin=0, vmax=max(float(w.max()), 1e-9))
    if col_labels is not None:
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=60, ha="right")
    if row_labels is not None:
        ax.set_yticks(range(len(row_labels)), row_labels)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return fig
