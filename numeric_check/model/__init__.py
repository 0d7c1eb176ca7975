"""The reference model in the paper's convention: :class:`CircuitModel` and its config, layers,
hook points, rotary positions, mixtures of experts, the thread policy, and our own safetensors
checkpoints. It reads nothing of other libraries' models: their conversion into a
:class:`CircuitModel` is :mod:`numeric_check.conversion`.
"""
