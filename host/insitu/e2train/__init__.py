"""``insitu.e2train``: E²-Train (Wang et al., NeurIPS 2019) on the NumPy training core.

* :mod:`~insitu.e2train.resnet`: a small ResNet whose residual blocks carry SLU's RNN gates;
* :mod:`~insitu.e2train.psg`: predictive sign gradients (8-bit x/w, 16-bit g, MSB predictor);
* :mod:`~insitu.e2train.energy`: counted operations and a bit-width-aware energy estimate;
* :mod:`~insitu.e2train.experiment`: rows with SMD, SLU, PSG and the 32-bit SGD baseline (each
  a learner of the run harness) and the experiment that compares them;
* :mod:`~insitu.e2train.plot`: accuracy vs energy figures.

The PSG arithmetic is specified once in :mod:`insitu.numerics` (``psg_*``); the PE3 sign path of
the RTL (:mod:`insitu.rtl.pe3`) is tested against the same functions.
"""

from insitu import lazy_exports

__all__ = ["ResNet", "PSGLayer", "SignSGD", "EnergyCounter", "E2Config", "E2Learner", "train_row",
           "run_experiment"]
__getattr__, __dir__ = lazy_exports(__name__, {
    "ResNet": "insitu.e2train.resnet", "PSGLayer": "insitu.e2train.psg", "SignSGD": "insitu.e2train.psg",
    "EnergyCounter": "insitu.e2train.energy", "E2Config": "insitu.e2train.experiment",
    "E2Learner": "insitu.e2train.experiment", "train_row": "insitu.e2train.experiment",
    "run_experiment": "insitu.e2train.experiment",
})
