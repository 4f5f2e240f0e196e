"""Sokoban with a tool agent and a plan agent."""
