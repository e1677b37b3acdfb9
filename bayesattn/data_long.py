"""Old location, kept so that ``from bayesattn.data_long import make_retrieval_task`` keeps
working: the long-sequence tasks live in :mod:`bayesattn.data.long`."""

from __future__ import annotations

from .data.long import RetrievalTask, make_retrieval_task

__all__ = ["RetrievalTask", "make_retrieval_task"]
