"""Triton kernels (optional extra ``sparsenorm[gpu]``); filled in below."""
