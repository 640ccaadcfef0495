"""An engine's precision, as degrade mode's lower_precision action leaves it, and the fuse that keeps a model at
full precision once a batch failed at the lower one.

A batch that fails while its engine runs lower is run again at full precision, and the action stays off for that
model (a crash, or audio that is not finite, at a lower precision repeats under the same load: the VITS flow's
"Discriminant has negative values" in fp16 did on every batch), across its reloads, until the operator resets it
(POST /admin/api/models/{model}/precision/reset) or the server restarts: the models it is off for are kept in a
table the service holds (DegradeController.precision_off), not on the loop. The Admin tab and the status say so.
The engine is switched on the engine's thread only (EngineLoop's errands, and the strategy between batches).
"""

from __future__ import annotations

import logging
from enum import StrEnum

from ..engines.base import Engine

log = logging.getLogger(__name__)


class Precision(StrEnum):
    FULL = "full"
    LOW = "low"
    LOW_UNSUPPORTED = "low (unsupported: no-op)"  # asked for, but the engine has no lower precision


class PrecisionState:
    def __init__(self, engine: Engine, off: dict[str, str] | None = None):
        """off: model -> why lower precision is off for it, shared by the loops of one service."""
        self.engine = engine
        self.level = Precision.FULL  # a new loop starts at full
        self._off = {} if off is None else off

    @property
    def failure(self) -> str | None:
        """Why lower precision is off for this model (a batch failed in it); None where it is not."""
        return self._off.get(self.engine.name)

    @property
    def lowered(self) -> bool:
        return self.level == Precision.LOW

    def describe(self) -> str:
        """What the Admin tab and the status show."""
        if self.failure:
            return f"full (lower precision off: {self.failure}; reset by the operator)"
        return str(self.level)

    def switch(self, low: bool) -> bool:
        """Degrade mode's action (on the engine's thread): whether the engine runs lower now (never after a failure)."""
        if low and self.failure:
            return False
        supported = self.engine.set_low_precision(low)
        self.level = Precision.FULL if not low else Precision.LOW if supported else Precision.LOW_UNSUPPORTED
        return supported

    def failed(self, error: BaseException) -> None:
        """A batch failed at the lower precision (on the engine's thread): back to full, and kept there."""
        self.engine.set_low_precision(False)
        self.level = Precision.FULL
        self._off[self.engine.name] = f"a batch failed in it ({type(error).__name__})"
        log.warning("%s: a batch failed at lower precision (%s: %s); it runs again at full precision, and lower "
                    "precision stays off for this model until the operator resets it", self.engine.name,
                    type(error).__name__, error)

    def reset(self) -> bool:
        """The operator's reset: degrade mode may lower the model again. False where nothing was off."""
        return self._off.pop(self.engine.name, None) is not None
