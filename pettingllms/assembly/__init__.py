"""Turning a config into a run: the plan (env, agents, policies, L0-L3, worker layouts), preflight checks, the
plan's description, run directories. Shared by the trainer and the evaluation, so neither reaches into the other."""
