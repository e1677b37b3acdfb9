"""Tests of ``bayesattn.interop``."""
