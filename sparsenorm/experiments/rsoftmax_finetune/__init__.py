"""Fine-tuning a pretrained transformer with sparse attention: the r-softmax paper's Sec. 4.2 (Table 2).

``data`` (Rotten Tomatoes sentences / GLUE TSVs), ``model`` (weights, normalizer in the attention,
fine-tuning, evaluation with measured sparsity), ``experiment`` (the runner's protocol), ``claims``
(summaries with the selection on validation, and verdicts) and ``report`` (tables and figures). Importing this
package imports neither transformers nor the data: the CLI lists it cheaply.
"""
from .experiment import EXPERIMENT, FinetuneExperiment

__all__ = ["EXPERIMENT", "FinetuneExperiment"]
