"""Multi-teacher on-policy distillation (Agents-A1 stage 3)."""
