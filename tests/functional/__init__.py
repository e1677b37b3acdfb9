"""Tests of ``bayesattn.functional``."""
