"""A policy that keeps module-level state, as a merchant's plugin that caches its parsed settings
would: the ``tag`` setting of the first call this instance served is kept in a global and given
as the close reason (``tag=<T>``) of every later call. The daemon must never let one merchant's
cached value answer another merchant's orders (tests/integration/polyglot.rs)."""

from typing import Optional

import wit_world
from wit_world.imports.types import (
    Cancel,
    CheckVerdict,
    Context,
    Decision,
    Decision_Cancel,
    Effect_RestoreStock,
    Order,
)

FIRST_TAG: Optional[str] = None


class WitWorld(wit_world.WitWorld):
    def decide(self, order: Order, context: Context) -> Decision:
        global FIRST_TAG
        if FIRST_TAG is None:
            FIRST_TAG = next((v for k, v in context.settings if k == "tag"), "")
        effects = [Effect_RestoreStock((i.sku, i.quantity)) for i in order.items]
        return Decision_Cancel(Cancel(reason=f"tag={FIRST_TAG}", effects=effects))

    def check(self, order: Order, context: Context) -> CheckVerdict:
        return CheckVerdict.UNKNOWN
