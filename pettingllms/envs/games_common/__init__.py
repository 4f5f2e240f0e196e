"""Shared pieces of the game envs (Sokoban, Sudoku, Plan-Path): the two agents, parsers, the env base."""
