"""Patch-based inference of the first stage (MCUNetV2's, which Tiny Training uses for its 128x128
networks, Sec. 3.1): the forward pass of the first layers, whose activations at high resolution
are the forward's peak, runs one spatial patch of the stage's output at a time, each patch with
the halo its receptive field needs, so that only one patch of those maps is in memory at once.

A stage is a prefix of the graph's nodes (convs and adds) ending at a **cut**: a tensor that is
the only one the rest of the network reads from the prefix. Its maps are computed patch by patch
and the cut's patches are placed into the whole cut, which the rest reads as before. Only frozen
layers whose activations the backward pass does not read can be in a stage (nothing of theirs is
saved), so a sparse update keeps its first layers in patches and the full update has none.

The cut is chosen per graph and trained set from the maps' sizes (:func:`choose_stage`): the one
whose estimated forward peak (the larger of the stage's, per patch, and the rest's) is smallest.
The compiler (:mod:`insitu.sparse.compiler`) emits the stage's kernels per patch: ``window`` cuts a
patch out of a map and places one into it, ``conv_fwd`` runs on a patch with its own pads.
"""

from __future__ import annotations

from dataclasses import dataclass

from insitu.sparse.graph import Add, Conv, Graph

#: Automatic patch-based inference is tried when 2x2 patches (AUTO_GRID, the paper's) cut the
#: forward's estimated peak by at least AUTO_MIN_SAVING; the compiler then plans the grids of
#: AUTO_GRIDS and keeps the smallest plan, if smaller than without patches.
AUTO_GRID = 2
AUTO_GRIDS = (2, 3, 4)
AUTO_MIN_SAVING = 0.1


@dataclass(frozen=True)
class Window:
    """Rows [r0, r1) and columns [c0, c1) of a map."""

    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def h(self) -> int:
        return self.r1 - self.r0

    @property
    def w(self) -> int:
        return self.c1 - self.c0

    def union(self, other: "Window") -> "Window":
        return Window(min(self.r0, other.r0), max(self.r1, other.r1), min(self.c0, other.c0), max(self.c1, other.c1))


@dataclass
class Stage:
    """The first ``len(nodes)`` nodes, run in ``grid`` x ``grid`` patches of ``output``;
    ``windows[p][t]``: the window of tensor ``t`` that patch ``p`` computes (or reads: the graph's
    input)."""

    nodes: list
    output: str
    grid: int
    windows: list[dict[str, Window]]


def whole(shape) -> Window:
    return Window(0, shape[1], 0, shape[2])


def input_window(n: Conv, out: Window, in_shape) -> Window:
    """The window of the conv's input that its output window reads (clipped to the map)."""
    _, H, W = in_shape
    s, p, k = n.stride, n.pad, n.kernel
    return Window(max(0, out.r0 * s - p), min(H, (out.r1 - 1) * s - p + k),
                  max(0, out.c0 * s - p), min(W, (out.c1 - 1) * s - p + k))


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def patch_windows(graph: Graph, nodes: list, output: str, grid: int) -> list[dict[str, Window]]:
    """Per patch of ``output`` (a ``grid`` x ``grid`` split of its map), the window of every
    tensor of the stage: the union of what its readers in the stage need."""
    T = graph.tensors
    _, H, W = T[output].shape
    out = []
    for r0, r1 in _split(H, grid):
        for c0, c1 in _split(W, grid):
            need = {output: Window(r0, r1, c0, c1)}
            for n in reversed(nodes):
                if n.y not in need:
                    continue
                wanted = ([(n.x, input_window(n, need[n.y], T[n.x].shape))] if isinstance(n, Conv)
                          else [(n.a, need[n.y]), (n.b, need[n.y])])
                for t, w in wanted:
                    need[t] = need[t].union(w) if t in need else w
            out.append(need)
    return out


def _consumers(graph: Graph) -> dict[str, list[int]]:
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        for t in ((n.a, n.b) if isinstance(n, Add) else (n.x,)):
            readers.setdefault(t, []).append(i)
    return readers


def candidate_cuts(graph: Graph, saved: set[str]) -> list[int]:
    """The stage lengths k allowed: ``nodes[:k]`` (two or more) are convs and adds, none of their
    outputs but the cut is saved for the backward pass, and the rest reads nothing of the prefix
    but the cut (a map of at least 2x2)."""
    readers = _consumers(graph)
    out = []
    for k, n in enumerate(graph.nodes, start=1):
        if not isinstance(n, (Conv, Add)):
            break
        inside = [graph.input] + [m.y for m in graph.nodes[:k]]
        if any(t in saved for t in inside[1:-1]):
            break
        if min(graph.tensors[n.y].shape[1:]) < 2:
            break
        if k >= 2 and all(t == n.y or max(readers.get(t, [-1])) < k for t in inside):
            out.append(k)
    return out


def _weights(n) -> int:
    """The bytes a conv's weights, bias and requantization take while it runs (a frozen layer's
    are loaded from flash into a scratch buffer)."""
    return n.weight.size + 12 * n.out_channels if isinstance(n, Conv) else 0


def _peak(graph: Graph, nodes: list, live: dict[str, int], size, readers, end: int) -> int:
    """The largest sum of live tensors' bytes (and the running conv's weights) over ``nodes``
    (``size(t)``: a tensor's bytes; a tensor lives until its last reader among the first ``end``
    nodes, the graph's output to the end)."""
    peak = sum(live.values())
    for n in nodes:
        i = graph.nodes.index(n)
        live[n.y] = size(n.y)
        peak = max(peak, sum(live.values()) + _weights(n))
        for t in list(live):
            last = max((r for r in readers.get(t, []) if r < end), default=-1)
            if t != graph.output and last <= i and t != n.y:
                del live[t]
        if n.y != graph.output and max((r for r in readers.get(n.y, []) if r < end), default=-1) <= i:
            del live[n.y]
    return peak


def forward_peak(graph: Graph, stage: Stage | None = None) -> int:
    """The estimated peak of the forward pass (bytes of int8 maps and of the running conv's
    weights), with ``stage`` run in patches: the larger of the stage's (the input, the whole cut
    and one patch's maps) and the rest's."""
    T, readers = graph.tensors, _consumers(graph)
    full = lambda t: T[t].size
    if stage is None:
        return _peak(graph, graph.nodes, {graph.input: full(graph.input)}, full, readers, len(graph.nodes))
    k = len(stage.nodes)
    rest = _peak(graph, graph.nodes[k:], {stage.output: full(stage.output)}, full, readers, len(graph.nodes))
    held = full(graph.input) + full(stage.output)
    per_patch = 0
    for win in stage.windows:
        size = lambda t, win=win: T[t].shape[0] * win[t].h * win[t].w
        per_patch = max(per_patch, _peak(graph, stage.nodes, {graph.input: size(graph.input)}, size, readers, k))
    return max(rest, held + per_patch)


def choose_stage(graph: Graph, saved: set[str], grid: int | None) -> Stage | None:
    """The stage of ``grid`` x ``grid`` patches with the smallest estimated forward peak (the
    shortest among equals); ``grid`` None: :data:`AUTO_GRID`, and only if it saves at least
    :data:`AUTO_MIN_SAVING` of the forward's peak. None: no patches (grid 1, or no stage allowed)."""
    if grid == 1:
        return None
    g = AUTO_GRID if grid is None else grid
    best: tuple[int, Stage] | None = None
    for k in candidate_cuts(graph, saved):
        nodes, output = graph.nodes[:k], graph.nodes[k - 1].y
        if min(graph.tensors[output].shape[1:]) < g:
            continue
        stage = Stage(nodes, output, g, patch_windows(graph, nodes, output, g))
        peak = forward_peak(graph, stage)
        if best is None or peak < best[0]:
            best = (peak, stage)
    if best is None:
        return None
    if grid is None and best[0] > (1 - AUTO_MIN_SAVING) * forward_peak(graph):
        return None
    return best[1]
