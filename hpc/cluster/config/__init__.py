"""Typed configuration: cluster profiles, job specs, and how the layers combine."""
