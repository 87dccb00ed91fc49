"""The ev-softmax paper's setting for Sec. 4.1 (the conditional VAE) and this experiment's defaults: a
leaf module (imports nothing of the experiment), shared by the experiment, its claims and its report."""

PAPER = "ev-softmax (Chen et al., NeurIPS 2021), Sec. 4.1, Fig. 2-3, Appendix E.1"
SOURCE = "Sec. 4.1, Fig. 3"
DEFAULT_NORMALIZERS = ("softmax", "sparsemax", "entmax15", "posthoc_evidential", "ev_softmax")
# the KL weight of the authors' code (see Settings.kl_weight)
AUTHORS_KL_WEIGHT = 0.01 / 64

PAPER_SETTING = {
    "data": "MNIST (torchvision, 60k training images)",
    "epochs": "20 (Appendix E.1; the authors' script defaults to 10)",
    "seeds": "10",
    "batch": "64",
    "optimizer": "SGD, learning rate 1e-3",
    "Gumbel-Softmax temperature": "not stated (0.67 in the authors' code)",
    "KL weight": "'standard ELBO' in the text; 0.01 x batch mean (= 0.01/64 per example) in the authors' code",
    "classifier Q": "not described (a CNN trained for 1 epoch in the authors' code)",
}
