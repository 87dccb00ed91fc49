"""Pure-PyTorch algorithms: the reference every kernel is tested against, and the path on every
device without a kernel. They work on rows along the last dimension and never synchronise with
the host (no ``.item()``, ``bool(tensor)`` or data-dependent Python branch), except where a
function says it is the CPU-only variant."""
