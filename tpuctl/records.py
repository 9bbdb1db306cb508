"""``Record``: ``typing.NamedTuple`` for the values on the light path, without importing typing.

``tpuctl barrier``, ``status`` and ``env`` should cost little more than starting Python. ``typing`` takes
about 15 ms to import with what it brings (``re``, ``collections``, ``contextlib``), and every
``NamedTuple`` class then runs ``collections.namedtuple``'s ``exec``; the values these commands read
(:mod:`tpuctl.agent.protocol`, :mod:`tpuctl.health`, :mod:`tpuctl.job.env`) are records built here instead.

A module declares them as it would a NamedTuple, and mypy checks them as one::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple as Record
    else:
        from tpuctl.records import Record

    class BarrierPassed(Record):
        name: str
        instance: int = 0

At run time a record is a tuple with the same behaviour: the fields in the order of the class's
annotations (read as strings, so the module needs ``from __future__ import annotations``), defaults from
the class body, keyword or positional construction, read-only field properties, ``_fields``,
``_field_defaults``, ``_replace``, ``_asdict``, the NamedTuple ``repr``, equality, hashing, unpacking,
pickling and copying as a tuple. Like NamedTuple, a record class is not subclassed further.
"""

from __future__ import annotations

from _operator import itemgetter  # operator's C half: the operator module would add its import

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Self

__all__ = ["Record"]


class Record(tuple):  # type: ignore[type-arg]  # mypy sees typing.NamedTuple (the module docstring)
    """Base of a record class: see the module's docstring."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()
    _field_defaults: dict[str, Any] = {}  # noqa: RUF012  # replaced per class, never mutated

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields = tuple(cls.__annotations__)  # the class's own (Python 3.10+), as strings
        defaults: dict[str, Any] = {}
        for i, name in enumerate(fields):
            if name in cls.__dict__:
                defaults[name] = cls.__dict__[name]
            elif defaults:
                raise TypeError(f"{cls.__name__}: field {name!r} without a default follows one with a default")
            setattr(cls, name, property(itemgetter(i), doc=f"Alias for field number {i}"))
        cls._fields = fields
        cls._field_defaults = defaults

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        fields = cls._fields
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}() takes {len(fields)} arguments, {len(args)} given")
        values = list(args)
        for name in fields[len(args) :]:
            if name in kwargs:
                values.append(kwargs.pop(name))
            elif name in cls._field_defaults:
                values.append(cls._field_defaults[name])
            else:
                raise TypeError(f"{cls.__name__}() missing required argument {name!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected or repeated arguments {sorted(kwargs)}")
        return tuple.__new__(cls, values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in zip(self._fields, self, strict=True))})"

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self)

    def _replace(self, **changes: Any) -> Self:
        unknown = set(changes) - set(self._fields)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        return type(self)(*(changes.get(n, v) for n, v in zip(self._fields, self, strict=True)))

    def _asdict(self) -> dict[str, Any]:
        return dict(zip(self._fields, self, strict=True))
