"""Early stopping on the validation loss, and restoring the best weights."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .config import TrainConfig
from .history import History

__all__ = ["EarlyStopping"]


class EarlyStopping:
    """Watches the validation loss: an evaluation *improves* when its loss is below the best so
    far by more than ``config.min_delta``; after ``config.early_stopping_patience`` evaluations
    without improvement training stops. With ``restore_best`` (and a patience) the weights of the
    best evaluation are kept (on the CPU) to be loaded when training ends.

    The best loss and epoch are recorded in the :class:`History` (``best_val_loss``,
    ``best_epoch``); this object holds the count of bad evaluations and the best weights.
    """

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.bad_evals = 0
        self.best_state: dict[str, Tensor] | None = None

    @property
    def keeps_best(self) -> bool:
        c = self.config
        return c.early_stopping_patience is not None and c.restore_best

    def update(self, val_loss: float, epoch: int, history: History, network: nn.Module) -> bool:
        """Record the evaluation of (1-based) ``epoch``; True when patience has run out."""
        c, h = self.config, history
        if h.best_val_loss is None or val_loss < h.best_val_loss - c.min_delta:
            h.best_val_loss, h.best_epoch = val_loss, epoch
            self.bad_evals = 0
            if self.keeps_best:
                self.best_state = {
                    k: v.detach().cpu().clone() for k, v in network.state_dict().items()
                }
            return False
        self.bad_evals += 1
        patience = c.early_stopping_patience
        return patience is not None and self.bad_evals >= patience

    def restore(self, network: nn.Module) -> None:
        """Load the best weights, when kept."""
        if self.keeps_best and self.best_state:
            network.load_state_dict(self.best_state)

    def state_dict(self) -> dict[str, Any]:
        return {"bad_evals": self.bad_evals, "best_state": self.best_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bad_evals = int(state["bad_evals"])
        self.best_state = state["best_state"]
