"""Tests of ``bayesattn.training``."""
