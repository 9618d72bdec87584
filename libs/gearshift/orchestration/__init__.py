"""The closed loop: Celery tasks (score, snapshot, train, evaluate, publish), the job journal in
the store's database, runners for training jobs (local subprocess, Kubernetes Job), the
promotion gate and publishing to the policy server."""
