"""Tests of ``bayesattn.models``."""
