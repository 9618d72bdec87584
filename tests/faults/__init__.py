"""The fault suite (issue 60): the platform under steady load through its gateway while one
dependency at a time fails: each gRPC service's replica killed with SIGKILL and started again,
the store's Postgres cut and restored, a Redis restarted, the policy server killed and started
again. Every episode a client was told of must be in the store; every other request must have
ended in a clear error. `make test` runs the short form, `make faults` the long one
(GEARSHIFT_FAULTS_LONG=1); docs/results/faults.md has a long run's table."""
