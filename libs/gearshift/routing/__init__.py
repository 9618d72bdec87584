"""The learned cost-aware router: query features, per-mode success classifiers, the
expected-cost-of-pass decision, the training dataset from the store, and offline evaluation.

Nothing here imports torch at module level: the router service loads the sentence-embedding
model only when an artefact asks for it (see features.py).
"""
