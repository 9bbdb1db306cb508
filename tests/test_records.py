"""tpuctl.records.Record behaves as the typing.NamedTuple mypy sees in its place."""

from __future__ import annotations

import copy
import pickle
from typing import NamedTuple

import pytest

from tpuctl.records import Record


class Point(Record):
    x: int
    y: str = "a"
    """A field's docstring, as NamedTuple classes have them."""

    def twice(self) -> int:
        return self.x * 2

    @property
    def loud(self) -> str:
        return self.y.upper()


class NamedPoint(NamedTuple):
    x: int
    y: str = "a"


def test_a_record_is_the_tuple_a_named_tuple_is() -> None:
    point, named = Point(1), NamedPoint(1)
    assert point == named == (1, "a") and hash(point) == hash(named)
    assert Point(x=1, y="b") == Point(1, "b") == NamedPoint(1, "b")
    assert repr(Point(1)) == "Point(x=1, y='a')" == repr(named).replace("NamedPoint", "Point")
    assert Point._fields == NamedPoint._fields and Point._field_defaults == NamedPoint._field_defaults
    assert point._replace(y="z") == Point(1, "z") and type(point._replace(x=2)) is Point
    assert point._asdict() == named._asdict()
    x, y = point
    assert (x, y, point[0], point.twice(), point.loud) == (1, "a", 1, 2, "A")
    assert copy.deepcopy(point) == point and type(copy.copy(point)) is Point
    assert pickle.loads(pickle.dumps(point)) == point


@pytest.mark.parametrize(
    "build", [lambda: Point(), lambda: Point(1, "a", 2), lambda: Point(1, z=2), lambda: Point(1, x=2)]
)
def test_wrong_arguments_are_a_type_error(build: object) -> None:
    with pytest.raises(TypeError):
        build()  # type: ignore[operator]


def test_fields_are_read_only_and_replace_knows_them() -> None:
    with pytest.raises(AttributeError):
        Point(1).x = 2  # type: ignore[misc]
    with pytest.raises(ValueError):
        Point(1)._replace(z=1)


def test_a_field_without_a_default_after_one_with_is_refused() -> None:
    with pytest.raises(TypeError, match="without a default"):

        class Bad(Record):
            a: int = 0
            b: int
