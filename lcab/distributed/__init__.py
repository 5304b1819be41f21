"""Distributed environment: process-group setup (local spawn, torchrun, SLURM) and CP groups."""
