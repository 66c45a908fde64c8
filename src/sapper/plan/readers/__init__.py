"""Config readers, one module per format, found by content through
:mod:`sapper.plan.readers.registry` (see :mod:`sapper.plan.readers.base` for the contract).

Imports nothing itself: the registry imports each reader only when a file is read, and a
regular package (not a namespace one) is what import analysis and packaging can see.
"""
