"""ev-softmax paper, Sec. 4.4 / Table 4: sparse attention in an EN->DE transformer (``sparsenorm reproduce mt``).

``data`` (parallel text), ``model`` (pre-LN encoder-decoder on :mod:`sparsenorm.attention`),
``train`` (the DDP training loop, torchrun entry point), ``decode`` (greedy and beam search),
``evaluate`` (BLEU, chrF, ROUGE-L, attended keys, maps), ``experiment`` (the runner's Experiment),
``report`` (tables, claims, figures).
"""
from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
