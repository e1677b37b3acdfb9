from .arviz_io import *  # noqa: F403
from .arviz_io import __all__
