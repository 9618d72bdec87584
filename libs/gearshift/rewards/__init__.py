"""Rewards shared by the reward service, evaluation and training: verifiers, A^2FM format and
SR2AM structure checks, the correctness / APO / SR2AM formulas, and cost of pass."""
