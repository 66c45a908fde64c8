"""``sapper diagnose``: the first cause of a blow-up, from the findings of ``analyze`` on
the logs, ``check`` on the config and what restarts did, reasoned over the causal map
beside the rules (:mod:`sapper.rules.causes`)."""
