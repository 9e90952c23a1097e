"""A read-only mapping by name that grows through `register`: the shape of the method, dataset and
zoo tables, so that each of them is one object with one way in."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class NamedTable(Mapping[str, T], Generic[T]):
    """Items of one type keyed by their ``name`` attribute, in registration order.

    Reading is a plain ``Mapping``; `register` adds an item (refusing a taken name unless
    ``replace=True``) and `remove` takes one out (for tests and interactive sessions).
    """

    def __init__(self, kind: str, item_type: type[T]) -> None:
        self._kind = kind
        self._item_type = item_type
        self._items: dict[str, T] = {}

    def register(self, item: T, *, replace: bool = False) -> T:
        if not isinstance(item, self._item_type):
            raise ValueError(f"expected a {self._item_type.__name__}, got {type(item).__name__}.")
        name = item.name  # type: ignore[attr-defined]
        if name in self._items and not replace:
            raise ValueError(f"{self._kind} {name!r} is already registered; pass replace=True to redefine it.")
        self._items[name] = item
        return item

    def remove(self, name: str) -> T:
        """Take an item out of the table and return it."""
        if name not in self._items:
            raise ValueError(f"no {self._kind} {name!r} is registered; registered: {', '.join(self._items)}.")
        return self._items.pop(name)

    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._kind}: {', '.join(self._items)})"
