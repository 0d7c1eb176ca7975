"""The reference model in the paper's convention: :class:`CircuitModel` and its config, hook points,
adapters from TransformerLens and Hugging Face GPT-2, and safetensors checkpoints.
"""
