"""``insitu.lrt``: low-rank training (LRT / SKS) for weights in non-volatile memory.

Implements Gonugondla et al., "Low-rank training of deep neural networks for emerging memory
technology" and its longer version "Streaming Kronecker sum training" (``../shared/papers``).
"""
