"""Shared pieces of the training jobs (training-jobs/sft, distill, apo): data from the store,
tokenization with loss masks, losses, advantages, checkpoints, the run bookkeeping, and the
runtime that makes a job one job across torchrun's ranks (distributed, batching)."""
