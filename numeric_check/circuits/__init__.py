"""Circuits and analyses: factored matrices, OV and QK circuits, composition scores, head
detection, skip-trigram tables, term importance and measured behaviour.
"""
