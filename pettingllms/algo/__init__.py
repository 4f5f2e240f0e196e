"""Algorithms: grouping, advantages, filters, losses. Tensors in, tensors out; verl only via ``verl_adapter``."""
