"""Small float ONNX CNNs built with onnx.helper for the tests of the ONNX import: random weights
and BatchNorm statistics, every operator the import takes, at a chosen opset."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


class Net:
    """An ONNX graph under construction: ``x = net.conv(x, ...)`` appends nodes, ``net.model()``
    makes the model. Weights are He-scaled normals, BN statistics near identity, all seeded."""

    def __init__(self, channels=1, size=12, opset=13, seed=0, batch="N", input_name="input"):
        self.rng = np.random.default_rng(seed)
        self.opset, self.nodes, self.inits, self.k = opset, [], [], 0
        self.input = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, [batch, channels, size, size])
        self.x, self.channels = input_name, channels

    def _name(self, op):
        self.k += 1
        return f"{op}{self.k}"

    def const(self, value, name=None):
        name = name or self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(self, op, inputs, name=None, outputs=1, **attrs):
        name = name or self._name(op.lower())
        outs = [f"{name}_out{i}" if i else f"{name}_out" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, **attrs))
        return outs[0]

    def conv(self, x, c_in, c_out, k=3, stride=1, groups=1, pad=None, bias=True, name=None, **attrs):
        w = self.rng.standard_normal((c_out, c_in // groups, k, k)) * np.sqrt(2.0 / (c_in // groups * k * k))
        inputs = [x, self.const(w)] + ([self.const(self.rng.normal(0, 0.1, c_out))] if bias else [])
        pad = k // 2 if pad is None else pad
        return self.node("Conv", inputs, name, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                         group=groups, **attrs)

    def bn(self, x, c, name=None):
        r = self.rng
        params = [r.uniform(0.5, 1.5, c), r.normal(0, 0.1, c), r.normal(0, 0.1, c), r.uniform(0.5, 1.5, c)]
        return self.node("BatchNormalization", [x, *map(self.const, params)], name, epsilon=1e-3)

    def relu(self, x, name=None):
        return self.node("Relu", [x], name)

    def relu6(self, x, name=None):
        if self.opset < 11:                      # Clip-6: min and max are attributes
            return self.node("Clip", [x], name, min=0.0, max=6.0)
        return self.node("Clip", [x, self.const(0.0), self.const(6.0)], name)

    def add(self, a, b, name=None):
        return self.node("Add", [a, b], name)

    def gap(self, x, name=None):
        return self.node("GlobalAveragePool", [x], name)

    def flatten(self, x, name=None):
        return self.node("Flatten", [x], name, axis=1)

    def reshape(self, x, c, name=None):
        return self.node("Reshape", [x, self.inits_int64([-1, c])], name)

    def inits_int64(self, value):
        name = self._name("shape")
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
        return name

    def gemm(self, x, c, classes, trans_b=True, name=None):
        w = self.rng.standard_normal((classes, c)) * np.sqrt(1.0 / c)
        return self.node("Gemm", [x, self.const(w if trans_b else w.T), self.const(self.rng.normal(0, 0.1, classes))],
                         name, transB=int(trans_b), alpha=1.0, beta=1.0)

    def matmul_add(self, x, c, classes, name=None):
        w = self.rng.standard_normal((c, classes)) * np.sqrt(1.0 / c)
        y = self.node("MatMul", [x, self.const(w)], name)
        return self.add(y, self.const(self.rng.normal(0, 0.1, classes)), f"{name or 'matmul'}.bias")

    def model(self, y, classes, output="logits"):
        self.nodes.append(helper.make_node("Identity", [y], [output], name="out"))
        graph = helper.make_graph(self.nodes, "net", [self.input],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["N", classes])],
                                  self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8 if self.opset >= 7 else 3
        return model


def mobilenet_like(opset=13, channels=1, size=12, seed=0, classes=5, flatten="flatten", head="gemm"):
    """Every supported operator: conv + BN + relu6 stem (stride 2), an inverted residual block
    (1x1 expand + BN + relu, depthwise 3x3 (group = C) + BN + relu6, 1x1 project + BN, a residual
    Add), a 1x1 head conv + a bias Add + relu, Dropout, GlobalAveragePool, Flatten or Reshape, and a Gemm or
    MatMul + Add classifier."""
    n = Net(channels, size, opset, seed)
    x = n.relu6(n.bn(n.conv(n.x, channels, 8, 3, 2, bias=False, name="stem"), 8))
    e = n.relu(n.bn(n.conv(x, 8, 16, 1, pad=0, name="b1.expand"), 16))
    d = n.relu6(n.bn(n.conv(e, 16, 16, 3, 1, groups=16, name="b1.dw"), 16))
    p = n.bn(n.conv(d, 16, 8, 1, pad=0, name="b1.project"), 8)
    r = n.add(x, p, "b1.add")
    h = n.conv(r, 8, 24, 1, pad=0, bias=False, name="head")
    h = n.relu(n.add(h, n.const(n.rng.normal(0, 0.1, (1, 24, 1, 1))), "head.bias"))
    h = n.node("Dropout", [h], "drop")
    v = n.gap(h, "pool")
    v = n.flatten(v) if flatten == "flatten" else n.reshape(v, 24)
    y = n.gemm(v, 24, classes, name="fc") if head == "gemm" else n.matmul_add(v, 24, classes, name="fc")
    return n.model(y, classes)
