"""Backends: one folder per target (compiler call, launcher, emitter dialect)."""
