"""Route-then-align SFT (A^2FM): one model learns to classify a query's mode and to answer in it."""
