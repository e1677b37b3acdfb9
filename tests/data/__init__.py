"""Tests of ``bayesattn.data``."""
