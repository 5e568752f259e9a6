"""Chapter 07's explorers (see attncourse.explore)."""
import numpy as np

from . import Explorer, _go, _layout, _menu, _r, _slider

__all__ = ["vit_attention", "swin_shift"]

# Pastel colours, one per group of tokens (Set3): dark enough to see, light enough to read a number on.
_GROUP_COLOURS = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
                  "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]
_INK = [[0.0, "rgba(0,0,0,0)"], [1.0, "rgba(0,0,0,0.8)"]]      # a digit drawn on top: transparent paper, dark ink


def _array(x):
    return np.asarray(x.detach().cpu().double().numpy() if hasattr(x, "detach") else x, dtype=float)


def vit_attention(images, weights, labels, predicted):
    """What each token of the digits ViT attends to: pick a layer and a query token (the class token or a
    patch) and see its attention over the patches, averaged over the heads, on every digit at once.

    ``images`` [K, 1, S, S] or [K, S, S]: the digits, values in [0, 1]; ``weights``: one
    [K, heads, N + 1, N + 1] tensor per layer (``images.capture_attention``), token 0 the class token and
    tokens 1..N the patches, row by row, N = grid * grid; ``labels`` and ``predicted`` [K]."""
    from plotly.subplots import make_subplots
    go = _go()
    digits = _array(images)
    digits = digits.reshape(len(digits), digits.shape[-2], digits.shape[-1])
    K, S = len(digits), digits.shape[-1]
    maps = [_array(w).mean(1) for w in weights]              # per layer [K, N + 1, N + 1], mean over heads
    N = maps[0].shape[-1] - 1
    grid = int(round(N ** 0.5))
    assert grid * grid == N and S % grid == 0, "a square grid of patches that tiles the image"
    p = S // grid
    cols = min(K, 4)
    rows = -(-K // cols)
    titles = [f"label {int(y)}, predicted {int(yh)}" for y, yh in zip(labels, predicted)]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.03, vertical_spacing=0.12)
    zmax = float(max(m[:, :, 1:].max() for m in maps))
    patch_of = np.arange(1, N + 1).reshape(grid, grid).tolist()
    centres = [c * p + (p - 1) / 2 for c in range(grid)]     # a patch's cell covers its p x p pixels

    def axes(k):
        n = "" if k == 0 else str(k + 1)
        return "x" + n, "y" + n

    states = []
    for layer, m in enumerate(maps):
        for query in range(N + 1):
            label = (f"layer {layer + 1}: the class token" if query == 0 else
                     f"layer {layer + 1}: patch {query}")
            z = [_r(m[k, query, 1:].reshape(grid, grid)) for k in range(K)]
            own = [_r(m[k, query, 0]) for k in range(K)]
            shapes = []
            if query > 0:
                r, c = divmod(query - 1, grid)
                for k in range(K):
                    xa, ya = axes(k)
                    shapes.append(dict(type="rect", xref=xa, yref=ya, x0=c * p - 0.5, x1=(c + 1) * p - 0.5,
                                       y0=r * p - 0.5, y1=(r + 1) * p - 0.5, line=dict(color="#00bfff", width=3)))
            states.append((label, z, own, shapes))

    def notes(own):
        out = [a.to_plotly_json() for a in fig.layout.annotations[:K]]  # the panels' titles
        for k in range(K):
            xa, ya = axes(k)
            out.append(dict(text=f"weight on the class token: {own[k]:.3f}", xref=xa + " domain", yref=ya + " domain",
                            x=0.5, y=-0.02, xanchor="center", yanchor="top", showarrow=False, font=dict(size=11)))
        return out

    first = states[0]
    for k in range(K):
        row, col = k // cols + 1, k % cols + 1
        fig.add_trace(go.Heatmap(z=first[1][k], x=centres, y=centres, zmin=0, zmax=round(zmax, 4), colorscale="YlOrRd",
                                 showscale=k == 0, customdata=patch_of, colorbar=dict(title=dict(text="attention weight")),
                                 hovertemplate="patch %{customdata}<br>weight %{z:.3f}<extra></extra>"),
                      row=row, col=col)
        fig.add_trace(go.Heatmap(z=_r(digits[k]), zmin=0, zmax=1, colorscale=_INK, showscale=False, hoverinfo="skip"),
                      row=row, col=col)
    attention = list(range(0, 2 * K, 2))
    buttons = [(label, "update", [{"z": z}, {"shapes": shapes, "annotations": notes(own)}, attention])
               for label, z, own, shapes in states]
    fig.update_layout(**_layout("What each token of the digits ViT attends to (mean of the heads)",
                                height=260 * rows + 120, updatemenus=[_menu(buttons, y=1.16)],
                                margin=dict(l=20, r=20, t=110, b=40)))
    fig.update_layout(annotations=notes(first[2]), shapes=first[3])
    fig.update_xaxes(showticklabels=False, ticks="", showgrid=False, zeroline=False, constrain="domain",
                     range=[-0.5, S - 0.5])
    for k in range(K):
        xa, ya = axes(k)
        fig.layout[ya.replace("y", "yaxis")].update(range=[S - 0.5, -0.5], scaleanchor=xa, showticklabels=False,
                                                     ticks="", showgrid=False, zeroline=False)
    return Explorer("vit_attention", fig,
                    alt="Test digits, each coloured by the attention that one token of the trained ViT gives to each "
                        "of its patches, for the chosen layer and query token.",
                    hint="Pick a layer and a query: the class token, or a patch (outlined). The colour of each patch "
                         "is the weight the query gives it, averaged over the heads; the number under each digit is "
                         "the weight the query gives the class token. Compare the class token's maps from digit to "
                         "digit, and see whether a patch attends mostly to itself or to the others.")


def swin_shift(H, W, M, masks):
    """Shifted windows on an H x W token map: what the cyclic roll does and what the mask allows.

    ``masks[s]`` [nW, M*M, M*M] is the shifted-window mask for shift s = 0 .. len(masks) - 1 (your
    shifted_window_mask's, in a notebook): 0 where two tokens of a window may attend to each other, -100
    where not.  Tokens that may attend to each other form groups; a slider picks the shift, and the
    figure shows the groups on the map as it is, on the rolled map (cut into regular windows) and each
    window's mask."""
    from plotly.subplots import make_subplots
    go = _go()
    nh, nw = H // M, W // M
    n = M * M
    canvas_h, canvas_w = nh * (n + 1) - 1, nw * (n + 1) - 1
    states = []
    for s, mask in enumerate(masks):
        mask = _array(mask)
        assert mask.shape == (nh * nw, n, n), f"mask of shape {list(mask.shape)}, expected {[nh * nw, n, n]}"
        rolled = np.zeros((H, W), dtype=int)
        original = np.zeros((H, W), dtype=int)
        token = np.zeros((H, W), dtype=int)               # the rolled map: which token of the image sits here
        canvas = [[None] * canvas_w for _ in range(canvas_h)]
        ids = {}
        for k in range(nh * nw):
            wy, wx = divmod(k, nw)
            first = (mask[k] == 0).argmax(-1)         # the first token each token may attend to: its group
            for t in range(n):
                ty, tx = divmod(t, M)
                r, c = wy * M + ty, wx * M + tx
                gid = ids.setdefault((k, int(first[t])), len(ids))
                rolled[r, c] = gid
                R, C = (r + s) % H, (c + s) % W
                original[R, C] = gid
                token[r, c] = R * W + C
            block = _r(mask[k])
            for i in range(n):
                canvas[wy * (n + 1) + i][wx * (n + 1):wx * (n + 1) + n] = block[i]
        lines = []
        for (xa, ya), offset in ((("x", "y"), s), (("x2", "y2"), 0)):
            for v in range(offset % M or M, H, M):
                lines.append(dict(type="line", xref=xa, yref=ya, x0=-0.5, x1=W - 0.5, y0=v - 0.5, y1=v - 0.5,
                                  line=dict(color="black", width=3)))
            for v in range(offset % M or M, W, M):
                lines.append(dict(type="line", xref=xa, yref=ya, y0=-0.5, y1=H - 0.5, x0=v - 0.5, x1=v - 0.5,
                                  line=dict(color="black", width=3)))
        states.append((s, original.tolist(), rolled.tolist(), token.tolist(), canvas, lines))

    bands = len(_GROUP_COLOURS)
    scale = []
    for i in range(bands):
        scale += [[i / bands, _GROUP_COLOURS[i]], [(i + 1) / bands, _GROUP_COLOURS[i]]]
    number = np.arange(H * W).reshape(H, W).tolist()
    where = [[None] * canvas_w for _ in range(canvas_h)]
    for k in range(nh * nw):
        wy, wx = divmod(k, nw)
        for i in range(n):
            for j in range(n):
                where[wy * (n + 1) + i][wx * (n + 1) + j] = [k, i, j]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.05,
                        subplot_titles=["the token map: one colour per group", "rolled: regular windows",
                                        "each window's mask"])
    start = min(M // 2, len(states) - 1)                   # Swin's own shift, M // 2, shown first
    s0 = states[start]
    common = dict(zmin=-0.5, zmax=bands - 0.5, colorscale=scale, showscale=False, texttemplate="%{text}",
                  textfont=dict(size=10))
    fig.add_trace(go.Heatmap(z=[[g % bands for g in row] for row in s0[1]], text=number, **common,
                             hovertemplate="token %{text}: row %{y}, column %{x}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Heatmap(z=[[g % bands for g in row] for row in s0[2]], text=s0[3], **common,
                             hovertemplate="token %{text}, rolled to row %{y}, column %{x}<extra></extra>"),
                  row=1, col=2)
    fig.add_trace(go.Heatmap(z=s0[4], zmin=-100, zmax=0, colorscale=[[0, "#222222"], [1, "#ffffff"]], showscale=False,
                             customdata=where, hoverongaps=False,
                             hovertemplate="window %{customdata[0]}: query %{customdata[1]}, key %{customdata[2]}"
                                           "<br>mask %{z}<extra></extra>"), row=1, col=3)
    steps = [(f"{s}", "update", [{"z": [[[g % bands for g in row] for row in o], [[g % bands for g in row] for row in r], c],
                                  "text": [number, t, None]},
                                 {"shapes": lines}, [0, 1, 2]])
             for s, o, r, t, c, lines in states]
    fig.update_layout(**_layout(f"Shifted windows on a {H} x {W} token map, windows of {M} x {M}", height=420,
                                sliders=[_slider(steps, "the shift s = ", start)], margin=dict(l=30, r=20, t=80, b=40),
                                plot_bgcolor="#d62728"))     # the red lines between the windows' masks
    fig.update_layout(shapes=s0[5])
    for k, (h, w) in enumerate(((H, W), (H, W), (canvas_h, canvas_w)), start=1):
        xa, ya = ("x", "y") if k == 1 else (f"x{k}", f"y{k}")
        fig.layout["xaxis" + xa[1:]].update(showticklabels=False, ticks="", showgrid=False, zeroline=False,
                                            range=[-0.5, w - 0.5], constrain="domain")
        fig.layout["yaxis" + ya[1:]].update(showticklabels=False, ticks="", showgrid=False, zeroline=False,
                                            range=[h - 0.5, -0.5], scaleanchor=xa, constrain="domain")
    return Explorer("swin_shift", fig,
                    alt=f"Three views of a {H} x {W} token map cut into {M} x {M} windows for the chosen shift: the "
                        "tokens coloured by the group they may attend within, the same tokens after the cyclic roll, "
                        "and every window's mask.",
                    hint="Move the shift. At 0 every window is one group and every mask is white. With a shift, "
                         "the rolled map is still cut into regular windows, but the windows on the right and bottom "
                         "edges hold tokens from opposite edges of the image: the mask (dark: -100) splits them into "
                         "two or four groups. On the map as it is, the groups are the shifted windows, whole in the "
                         "middle and cut at the edges.")
