"""Shared pieces of the training jobs (training-jobs/sft, distill, apo): data from the store,
tokenization with loss masks, losses, advantages, checkpoints and the run bookkeeping."""
