"""Text protocols the policy speaks: A^2FM tags (a2fm) and SR2AM plan blocks (sr2am)."""
