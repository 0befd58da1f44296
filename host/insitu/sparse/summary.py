"""What an int8 graph is and costs: its layers with their shapes, MACs and parameters, and the
memory the compiler plans for its inference program (`insitu mcu import` shows them)."""

from __future__ import annotations

from insitu.sparse.graph import Add, Conv, GlobalAvgPool, Graph

__all__ = ["layer_rows", "graph_summary", "inference_plan"]


def _op(n: Conv, x_shape) -> str:
    if n.groups > 1:
        return "depthwise"
    if n.is_dense and x_shape[1:] == (1, 1):
        return "dense"
    return "pointwise" if n.kernel == 1 else "conv"


def layer_rows(graph: Graph) -> list[dict]:
    """One row a node: name, op, input and output shapes ``[C, H, W]``, and for convs kernel,
    stride, pad, groups, activation, MACs (of one forward) and parameters (weights + biases)."""
    T = graph.tensors
    rows = []
    for n in graph.nodes:
        row = {"name": n.name, "inputs": [list(T[t].shape) for t in graph.inputs_of(n)], "out": list(T[n.y].shape)}
        if isinstance(n, Conv):
            o, oh, ow = T[n.y].shape
            macs = oh * ow * o * n.weight.shape[1] * n.kernel * n.kernel
            row.update(op=_op(n, T[n.x].shape), kernel=n.kernel, stride=n.stride, pad=n.pad, groups=n.groups,
                       act=n.act, macs=int(macs), params=int(n.weight.size + n.bias.size))
        elif isinstance(n, Add):
            row.update(op="add", act=n.act, macs=0, params=0)
        elif isinstance(n, GlobalAvgPool):
            row.update(op="avgpool", macs=0, params=0)
        rows.append(row)
    return rows


def graph_summary(graph: Graph) -> dict:
    """Layers (:func:`layer_rows`), total MACs and parameters, and the bytes of the int8 weights
    and int32 biases."""
    rows = layer_rows(graph)
    return {"classes": graph.num_classes, "layers": rows,
            "macs": sum(r["macs"] for r in rows), "params": sum(r["params"] for r in rows),
            "parameter_bytes": sum(c.weight.size + 4 * c.bias.size for c in graph.convs)}


def inference_plan(graph: Graph) -> dict:
    """The compiler's memory plan of the forward pass and argmax alone (no layer trained, so every
    layer's weights load from flash when its kernel runs): ``{"arena_bytes", "calls"}``. The
    training programs plan the same forward pass inside their arena."""
    # The compiler's own builder and planner, stopped after the forward pass (a training compile
    # always has a backward part).
    from insitu.sparse import compiler
    from insitu.sparse.scheme import classifier_only

    builder = compiler._Builder(compiler.LayerTables(graph, {}, 1.0), classifier_only(graph), compiler.Options())
    ops = builder.forward()
    ops.append(builder.loss()[1])                       # argmax
    arena = compiler.plan_memory(builder.buffers, ops)
    return {"arena_bytes": int(arena), "calls": len(ops)}
