"""The attention adapters of the kernel layer: one call and its masks (:mod:`.call`), the dense path
(:mod:`.dense`), ev-softmax on FlexAttention (:mod:`.flex`) and the kernels ``sparse_attention`` runs,
by backend name (:mod:`.dispatch`; which one ``auto`` runs is decided in :mod:`..auto_plan`). The
attention ops themselves live with the other ops (``kernels/ops/evidential_attention.py``,
``kernels/ops/projection_attention.py``)."""
