"""Verification of path expansions: the model's own forward pass recorded and rerun with values
frozen (:mod:`~numeric_check.verification.hook_paths`), binding atoms to tensors from the recorded
pass, fast evaluation of terms, isolation of each path through the model's hooks, error bounds, and
the reports of :func:`verify_logits` and :func:`verify_qk`.
"""
