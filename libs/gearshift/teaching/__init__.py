"""Teachers: policies that write training data through the real executor (docs/teaching.md)."""
