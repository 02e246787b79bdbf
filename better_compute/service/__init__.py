"""Use cases: open one transaction, load what the decision needs, run the pure engine, apply."""
