"""Tests of ``bayesattn.study``."""
