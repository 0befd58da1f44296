"""``Sequential``: a chain of layers with the same forward/backward contract as one layer."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from .layers import Layer, Param

__all__ = ["Sequential"]


class Sequential(Layer):
    """Runs ``layers`` in order forward and in reverse order backward.

    Parameters are named ``"<index>.<name>"`` (``"0.weight"``); ``state_dict`` adds the buffers
    (``"2.running_mean"``). ``self.params``/``self.grads`` of the container itself stay empty.
    """

    def __init__(self, *layers: Layer):
        super().__init__()
        self.layers: list[Layer] = list(layers)

    def forward(self, x, train=True):
        for layer in self.layers:
            x = layer.forward(x, train)
        return x

    def backward(self, dy):
        for layer in reversed(self.layers):
            dy = layer.backward(dy)
        return dy

    def parameters(self, prefix: str = "") -> Iterator[Param]:
        for i, layer in enumerate(self.layers):
            yield from layer.parameters(f"{prefix}{i}.")

    def zero_grad(self) -> None:
        for layer in self.layers:
            layer.zero_grad()

    def predict(self, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """Eval-mode outputs (e.g. logits) for ``x``, computed ``batch_size`` samples at a time."""
        outs = [self.forward(x[i : i + batch_size], train=False) for i in range(0, len(x), batch_size)]
        return np.concatenate(outs, axis=0)

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        for i, layer in enumerate(self.layers):
            yield from layer.named_buffers(f"{prefix}{i}.")

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of all parameters and buffers, keyed ``"<index>.<name>"`` (for checkpoints)."""
        return collect_state(self)

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Copy arrays from :meth:`state_dict` back in place (keys and shapes must match)."""
        restore_state(self, state)

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i):
        return self.layers[i]

    def __iter__(self):
        return iter(self.layers)

    def __repr__(self):
        body = "".join(f"\n  ({i}): {layer!r}" for i, layer in enumerate(self.layers))
        return f"Sequential({body}\n)"


def collect_state(model) -> dict[str, np.ndarray]:
    """Copies of a model's parameters and buffers by key: anything with ``parameters()`` and
    ``named_buffers()`` (a :class:`Sequential`, the E2-Train ResNet)."""
    state = {p.key: p.value.copy() for p in model.parameters()}
    state.update((k, v.copy()) for k, v in model.named_buffers())
    return state


def restore_state(model, state: dict[str, np.ndarray]) -> None:
    """Copy :func:`collect_state`'s arrays back into ``model`` in place (keys and shapes must match)."""
    targets = {p.key: p.value for p in model.parameters()}
    targets.update(model.named_buffers())
    if set(state) != set(targets):
        raise KeyError(
            f"state dict keys differ: missing {sorted(set(targets) - set(state))}, "
            f"unexpected {sorted(set(state) - set(targets))}"
        )
    for key, v in targets.items():
        if np.shape(state[key]) != v.shape:
            raise ValueError(f"{key}: shape {np.shape(state[key])} != {v.shape}")
        v[...] = state[key]
