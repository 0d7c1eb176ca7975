"""Verification of path expansions: binding atoms to tensors from a recorded forward pass, fast
evaluation of terms, isolation of each path through the model's hooks, error bounds, and the
reports of :func:`verify_logits` and :func:`verify_qk`.
"""
