"""The r-softmax paper's numbers for Sec. 4.2 (fine-tuning BERT), shared by the experiment, claims and report."""

PAPER_LEARNING_RATES = (1e-5, 2e-5, 5e-5, 1e-4, 5e-4)
PAPER_R_FINALS = (0.05, 0.1, 0.15, 0.2, 0.5)
# Table 2, SST-2 column (accuracy %, BERT, GLUE dev set, best run of the grid); the full row per task.
PAPER_TABLE2 = {
    "softmax": {"MRPC": 84.56, "RTE": 68.95, "SST-2": 92.32, "QNLI": 91.76, "QQP": 91.12},
    "sparsemax": {"MRPC": 68.38, "RTE": 52.71, "SST-2": 79.82, "QNLI": 55.57, "QQP": 77.18},
    "sparsehourglass": {"MRPC": 68.38, "RTE": 52.71, "SST-2": 79.24, "QNLI": 70.99, "QQP": 76.04},
    "r_softmax": {"MRPC": 85.54, "RTE": 71.84, "SST-2": 92.89, "QNLI": 91.73, "QQP": 91.13},
}
PAPER_BEST_R_SST2 = 0.2
