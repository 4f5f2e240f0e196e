"""Sudoku (4x4 and 9x9, unique solutions) with a tool agent and a plan agent."""
