"""``insitu.lrt``: low-rank training (LRT / SKS) for weights in non-volatile memory.

Implements Gural, Nadeau, Tikekar and Murmann, "Low-rank training of deep neural networks for
emerging memory technology" (arXiv 2009.03887) and its longer version "Streaming Kronecker sum
training" (``../shared/papers``). Its public classes and functions are importable from here
(``from insitu.lrt import KroneckerSum``), each loaded on first use.
"""

from insitu import lazy_exports

#: The environments of the adaptation experiment (the paper's figure 2).
ENVS = ("control", "shift", "analog", "digital")
#: The online training schemes compared in it.
SCHEMES = ("inference", "bias", "sgd", "lrt", "lrt-maxnorm")

__all__ = ["ENVS", "SCHEMES", "KroneckerSum", "LowRankSum", "LRTConfig", "OnlineTrainer", "QNet",
           "paper_cnn", "dense_net", "NVMModel", "NVMArray", "make_drift", "OnlineData",
           "AdaptLearner", "run_adapt", "pretrained_model"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "KroneckerSum": "insitu.lrt.sks", "LowRankSum": "insitu.lrt.sks",
    "LRTConfig": "insitu.lrt.schemes", "OnlineTrainer": "insitu.lrt.schemes",
    "QNet": "insitu.lrt.qnet", "paper_cnn": "insitu.lrt.qnet", "dense_net": "insitu.lrt.qnet",
    "NVMModel": "insitu.lrt.nvm", "NVMArray": "insitu.lrt.nvm", "make_drift": "insitu.lrt.nvm",
    "OnlineData": "insitu.lrt.online",
    "AdaptLearner": "insitu.lrt.adapt", "run_adapt": "insitu.lrt.adapt",
    "pretrained_model": "insitu.lrt.adapt",
})
