"""Read-only attributes that a Python wrapper forwards to its C++ object."""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, Optional, TypeVar, overload

T = TypeVar("T")


class native_property(property, Generic[T]):
    """A read-only property whose value is ``self.native.<name>`` (the wrapper's
    C++ object): ``n_vocab = native_property[int]("n_vocab", "Tokens in the vocabulary.")``.
    A real property, so help() and a refused assignment read as for one written
    out; ``T`` keeps the value's type for type checkers."""

    def __init__(self, name: str, doc: str) -> None:
        super().__init__(attrgetter(f"native.{name}"))
        # On the instance: a subclass's own docstring would shadow property's doc slot.
        self.__doc__ = doc

    if TYPE_CHECKING:
        @overload
        def __get__(self, obj: None, owner: Optional[type] = None) -> "native_property[T]": ...

        @overload
        def __get__(self, obj: object, owner: Optional[type] = None) -> T: ...

        def __get__(self, obj: Any, owner: Optional[type] = None) -> Any: ...
