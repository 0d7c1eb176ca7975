"""Other people's models read into the reference model, a
:class:`~numeric_check.model.circuit_model.CircuitModel`: a TransformerLens ``HookedTransformer``
(:mod:`~numeric_check.conversion.adapters`) or a Hugging Face causal LM
(:mod:`~numeric_check.conversion.hf`, one reader per family in
:mod:`~numeric_check.conversion.readers`), read into the paper's convention by
:mod:`~numeric_check.conversion.build`; a model folder read as data
(:mod:`~numeric_check.conversion.load`, :mod:`~numeric_check.conversion.hub`); the sources'
options by allow-list (:mod:`~numeric_check.conversion.options`); and the converted model
measured against its source (:mod:`~numeric_check.conversion.source_check`).

This room imports the reference model (:mod:`numeric_check.model`), never the other way round.
"""
