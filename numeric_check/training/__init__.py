"""Toy training: the configuration of a training run and the small attention-only models it trains
(the shipped induction checkpoints are rebuilt with it).
"""
