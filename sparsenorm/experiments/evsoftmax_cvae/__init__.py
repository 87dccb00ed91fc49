"""The ev-softmax paper's CVAE experiment (Chen et al. 2021, Sec. 4.1, Fig. 2-3, Appendix E.1).

A conditional VAE on MNIST whose query y is "even" or "odd" and whose latent z is categorical with
K = 10 classes. The true prior p(z | y) needs five modes per query, so the task rewards a
normalizer that is sparse *and* multimodal. One file per job: :mod:`.model` (network and ELBO),
:mod:`.train` (one training run and the scores of its prior), :mod:`.claims` (summaries and
verdicts), :mod:`.report` (figures and tables), :mod:`.experiment` (settings and the runner's
``EXPERIMENT``).
"""
from .experiment import EXPERIMENT, FULL, QUICK, Settings

__all__ = ["EXPERIMENT", "FULL", "QUICK", "Settings"]
