"""Fixtures of the verl tests, which run in .venv-verl (``make test`` runs them there when that venv exists).

``MemoryTransferQueue`` keeps TransferQueue's key-value interface in a dict: the real one needs a Ray controller.
Everything else is verl's own code: the agent-loop postprocess that writes the rows, ``_balance_batch`` (padding rows
and the reorder), the v1 trainer's advantage step.
"""

from __future__ import annotations

import pytest
import torch
import transfer_queue
from transfer_queue import KVBatchMeta
from verl.utils.tensordict_utils import list_of_dict_to_tensordict


class MemoryTransferQueue:
    """``kv_batch_put`` / ``async_kv_batch_put`` / ``kv_batch_get`` over a dict of rows keyed (partition, key)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict] = {}
        self.tags: dict[tuple[str, str], dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None, data_parser=None):
        for i, key in enumerate(keys):
            row = self.rows.setdefault((partition_id, key), {})
            if fields is not None:
                for name in fields.keys():
                    value = fields.get(name)
                    row[name] = value[i] if isinstance(value, torch.Tensor) else value.tolist()[i]
            if tags is not None:
                self.tags[(partition_id, key)] = dict(tags[i])
        return KVBatchMeta(keys=list(keys), tags=[self.tags.get((partition_id, k), {}) for k in keys],
                           partition_id=partition_id)  # fmt: skip

    async def async_kv_batch_put(self, **kwargs):
        return self.kv_batch_put(**kwargs)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        keys = [keys] if isinstance(keys, str) else list(keys)
        rows = [self.rows[(partition_id, k)] for k in keys]
        names = [f for f in (select_fields or list(rows[0])) if f in rows[0]]
        return list_of_dict_to_tensordict([{f: row[f] for f in names} for row in rows])

    def meta(self, partition_id: str = "train") -> KVBatchMeta:
        keys = [k for p, k in self.rows if p == partition_id]
        return KVBatchMeta(keys=keys, tags=[self.tags[(partition_id, k)] for k in keys], partition_id=partition_id)


@pytest.fixture
def memory_tq(monkeypatch) -> MemoryTransferQueue:
    store = MemoryTransferQueue()
    for name in ("kv_batch_put", "async_kv_batch_put", "kv_batch_get"):
        monkeypatch.setattr(transfer_queue, name, getattr(store, name))
    return store
