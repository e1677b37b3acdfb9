"""The test suite. Its folders mirror the package: ``tests/<pkg>/`` tests ``bayesattn/<pkg>/``,
``tests/test_<module>.py`` a top-level module ``bayesattn/<module>.py``, and ``tests/cross_cutting/``
holds what tests the package as a whole (docs, examples, notebooks, the study end to end, layout,
typing, deprecations, faults, fuzzing, pickling). ``tests/cross_cutting/test_mirror.py`` checks
the rule. Every folder is a package (``__init__.py``), so files of the same name in two folders do
not collide and helpers import as ``tests.tasks``.
"""
