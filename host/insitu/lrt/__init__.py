"""``insitu.lrt``: low-rank training (LRT / SKS) for weights in non-volatile memory.

Implements Gonugondla et al., "Low-rank training of deep neural networks for emerging memory
technology" and its longer version "Streaming Kronecker sum training" (``../shared/papers``).
"""

#: The environments of the adaptation experiment (the paper's figure 2).
ENVS = ("control", "shift", "analog", "digital")
#: The online training schemes compared in it.
SCHEMES = ("inference", "bias", "sgd", "lrt", "lrt-maxnorm")
