"""Tests of the package as a whole: docs, examples, notebooks, the study end to end, layout, typing, deprecations, faults, fuzzing, pickling, private APIs."""
