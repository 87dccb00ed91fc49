"""The ev-softmax paper's semi-supervised VAE (Chen et al. 2021, Sec. 4.2, Table 2, App. E.2).

Files: ``data.py`` (labelled/unlabelled split, binarisation), ``model.py`` (M2 and its bounds),
``train.py`` (one training run and its evaluation), ``experiment.py`` (the runner's Experiment:
settings, jobs, aggregation, claims), ``report.py`` (tables and figures).
"""
from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
