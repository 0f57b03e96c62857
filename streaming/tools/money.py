"""The demo's operators (``streaming.tools.demo``), money in transit:
accounts hold balances, transfers move money between accounts owned by
different tasks.  They are written as a user writes operators, on the public
API of ``operators``.

``transfer_legs`` turns each transfer into a debit of its source account and
a credit of its target account; the stage routes each leg to the task that
owns its account, where ``Balances`` applies it.  While a credit travels
between tasks it is money in a channel, which is why a consistent snapshot
shows ``sum(balances in task states) + sum(credits in channel state) = total``.
``Balances`` is a keyed sum of signed deltas, nothing more."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from operators import (
    DeadLetters,
    KeyedAggregate,
    OperatorConfigError,
    Reason,
    Stateless,
    StateRestoreError,
    require_columns,
    row_index,
    sum_,
)

__all__ = ["Balances", "TransferLegs", "transfer_legs"]


class Balances(KeyedAggregate):
    """Balance per account: the sum of the signed ``amount`` deltas applied
    to it.  ``process()`` returns ``(key, balance)`` for every account the
    batch touched, with its new balance.  A delta with a null amount is not
    money: it goes to the dead letters with reason ``null_value`` (and a null
    account with ``null_key``).

    State: ``{"state": table of (key, balance)}``."""

    def __init__(
        self,
        key: str = "account",
        amount: str = "amount",
        *,
        balance: str = "balance",
        dead_letters: DeadLetters | None = None,
    ):
        if not (isinstance(amount, str) and amount):
            raise OperatorConfigError(f"Balances: amount must be a non-empty column name, got {amount!r}")
        super().__init__(key, {balance: sum_(amount)}, dead_letters=dead_letters)
        self.amount, self.balance_column = amount, balance

    def process(self, batch: pa.Table) -> pa.Table:
        require_columns(batch, [self.key, self.amount], type(self).__name__)
        if batch[self.amount].null_count:
            self.dead_letters.add(batch.filter(pc.is_null(batch[self.amount])), Reason.NULL_VALUE, type(self).__name__)
            batch = batch.filter(pc.is_valid(batch[self.amount]))
        return super().process(batch)

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        table = state.get(self.TABLE) if isinstance(state, Mapping) else None
        if (
            isinstance(table, pa.Table)
            and self.balance_column in table.column_names
            and table[self.balance_column].null_count
        ):
            raise StateRestoreError(f"Balances: snapshot has null balances in {self.balance_column!r}")
        super().restore(state)

    def total(self) -> int | float:
        """The sum of all balances (0 with no accounts)."""
        if len(self.state) == 0:
            return 0
        return pc.sum(self.state[self.balance_column]).as_py()

    def balance(self, account: object) -> int | float | None:
        """The balance of ``account``, or None if it was never touched."""
        if len(self.state) == 0:
            return None
        found = self.state.filter(
            pc.equal(self.state[self.key], pa.scalar(account, self.state.schema.field(self.key).type))
        )
        return found[self.balance_column][0].as_py() if found.num_rows else None

    def __repr__(self) -> str:
        return f"Balances(key={self.key!r}, amount={self.amount!r})"


class TransferLegs(Stateless):
    """Two rows per transfer, debit first: ``key`` = source account with
    ``-amount``, then ``key`` = target account with ``+amount``, and a
    ``leg`` column (``"debit"``/``"credit"``).  Other columns are kept; the
    source and target columns are dropped."""

    def __init__(
        self,
        source: str = "source",
        target: str = "target",
        amount: str = "amount",
        *,
        key: str = "account",
        leg: str = "leg",
    ):
        names = {"source": source, "target": target, "amount": amount, "key": key, "leg": leg}
        for argument, value in names.items():
            if not (isinstance(value, str) and value):
                raise OperatorConfigError(f"transfer_legs: {argument} must be a non-empty column name, got {value!r}")
        if len({source, target, amount}) != 3 or len({key, leg, amount}) != 3:
            raise OperatorConfigError(f"transfer_legs: column names must differ, got {names}")
        self.source, self.target, self.amount, self.key, self.leg = source, target, amount, key, leg

    def process(self, batch: pa.Table) -> pa.Table:
        require_columns(batch, [self.source, self.target, self.amount], repr(self))
        n = batch.num_rows
        doubled = pc.divide(row_index(2 * n), 2)  # 0, 0, 1, 1, ...
        is_debit = pc.equal(pc.bit_wise_and(row_index(2 * n), 1), 0)
        rows = batch.take(doubled)
        account = pc.if_else(is_debit, rows[self.source], rows[self.target])
        amount = pc.if_else(is_debit, pc.negate_checked(rows[self.amount]), rows[self.amount])
        kept = [c for c in batch.column_names if c not in (self.source, self.target, self.amount, self.key, self.leg)]
        out = rows.select(kept)
        out = out.append_column(self.key, account).append_column(self.amount, amount)
        return out.append_column(self.leg, pc.if_else(is_debit, "debit", "credit"))

    def __repr__(self) -> str:
        return f"transfer_legs({self.source!r} -> {self.target!r}, {self.amount!r})"


def transfer_legs(
    source: str = "source", target: str = "target", amount: str = "amount", *, key: str = "account", leg: str = "leg"
) -> TransferLegs:
    """Split each transfer row into its debit and credit legs (see TransferLegs)."""
    return TransferLegs(source, target, amount, key=key, leg=leg)
