"""The log pipeline every post-mortem command shares: find and read the logs, merge the
files of one run, build the monitor's detectors for the run's plan, analyze each log and
the ranks of one job together, and diagnose the whole.

``analyze``, ``diagnose``, ``report``, ``watch`` and ``run`` call it; each command module
only parses its options, calls this, and prints. Readers, detectors and pydantic are
imported inside the functions that need them, so a command's start-up pays only for what
it runs.
"""
