"""gearshift: an adaptive agent platform."""

__version__ = "0.1.0"
