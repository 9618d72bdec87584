"""Trajectory store service: trajectories, rewards and the checkpoint registry over gRPC."""
