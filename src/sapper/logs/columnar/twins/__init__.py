"""Vectorised twins of the runtime detectors, for ``sapper analyze`` on long logs.

One module per detector family (``loss``, ``gradnorm`` ...), each a numpy twin of the
streaming detector in ``sapper.runtime.detectors`` proven to give the same findings;
``fallback`` feeds the others record by record over only the rows they read;
``engine.run_columns`` runs a detector list over :class:`sapper.logs.columnar.Columns`.
"""
