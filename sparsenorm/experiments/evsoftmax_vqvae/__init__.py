"""Ev-softmax paper, Sec. 4.3 / Table 3: sparse class-conditional PixelCNN priors over a VQ-VAE's codes.

``sparsenorm reproduce vqvae``; the stages live in :mod:`.data`, :mod:`.vqvae`, :mod:`.pixelcnn`,
:mod:`.classifier`, :mod:`.experiment` (the runner's Experiment) and :mod:`.report`.
"""
from .experiment import EXPERIMENT

__all__ = ["EXPERIMENT"]
