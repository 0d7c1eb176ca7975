"""``tcircuits paper``: the companion to "A Mathematical Framework for Transformer Circuits".

:mod:`.measure` analyses the shipped models once; :mod:`.claims` states the paper's findings
with what the models show; :mod:`.content` lays out the sections with the catalogue's
derivations; :mod:`.figures`, :mod:`.site` and :mod:`.latex` write them; :mod:`.build` runs it all.
"""
