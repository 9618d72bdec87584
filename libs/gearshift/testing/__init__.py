"""Support for tests and benchmarks: the whole stack in one process on loopback sockets, and a
scripted stand-in for the policy model that isolates the platform's own logic from the model."""
