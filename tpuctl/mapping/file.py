"""The device mapping file: proto3 JSON of ``tpuctl.v1.DeviceMapping``, written atomically, loaded checked.

:func:`to_json` lays the message out with fields in declaration order, flat objects and short lists on
one line, so equal mappings give byte-identical files; :func:`from_json` refuses (MappingError naming
the file) anything that is not a consistent mapping of a schema version this tpuctl reads.
:func:`write_mapping` replaces the file atomically; :func:`read_mapping` reads one. Jobs call
``tpuctl.load_mapping()`` (:mod:`tpuctl.job.api`), which finds the file and this process's task.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NoReturn

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor

from tpuctl.errors import MappingError, StateError
from tpuctl.files import SHARED_MODE, FileTooLarge, atomic_write, read_regular_file
from tpuctl.mapping.model import KNOWN_SCHEMA_VERSIONS, MAX_LISTED, DeviceMapping, mapping_problems
from tpuctl.mapping.protobuf import _mesh_record_problems, _pb, from_proto, to_proto
from tpuctl.messages import closest, listed, suggestion

_REINIT_HINT = "re-run `tpuctl init` on every host to write a fresh mapping"
_INLINE_WIDTH = 100
_LIST_CHUNK = 16  # scalars per line when a list wraps (4 devices of device_coordinates)
MAX_MAPPING_BYTES = 64 * 1024 * 1024
"""Largest mapping file read: a v4-4096 mapping (512 hosts) is 0.3 MiB, 10,000 hosts about 6 MiB."""
MAX_NUMBER_CHARS = 32
"""Longest JSON number read (a 64-bit integer has 20 digits); longer is refused before Python converts it."""


# --- JSON ------------------------------------------------------------------------------------------


def _in_field_order(descriptor: Descriptor, obj: dict[str, Any]) -> dict[str, Any]:
    """json_format lists set fields before defaulted ones; order by declaration so the layout is fixed."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name not in obj:
            continue
        value = obj[field.name]
        sub = field.message_type
        if sub is not None and sub.full_name != "google.protobuf.Timestamp":
            value = [_in_field_order(sub, v) for v in value] if field.is_repeated else _in_field_order(sub, value)
        out[field.name] = value
    return out


def _scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list))


def _atom(value: Any) -> str:
    if type(value) is int:  # most of the file: a cheaper path than json.dumps
        return str(value)
    return json.dumps(value)


def _render(value: Any, indent: str) -> str:
    """JSON with flat objects and scalar lists on one line (wrapped when long), one device per line. O(size)."""
    inner = indent + "  "
    if isinstance(value, dict):
        if not value:
            return "{}"
        flat = all(_scalar(v) or (isinstance(v, list) and all(map(_scalar, v))) for v in value.values())
        if flat:
            one_line = "{" + ", ".join(f"{json.dumps(k)}: {_render(v, inner)}" for k, v in value.items()) + "}"
            if len(one_line) <= _INLINE_WIDTH:
                return one_line
        items = [f"{inner}{json.dumps(k)}: {_render(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list):
        if not value:
            return "[]"
        if all(map(_scalar, value)):
            atoms = [_atom(v) for v in value]
            one_line = "[" + ", ".join(atoms) + "]"
            if len(one_line) <= _INLINE_WIDTH:
                return one_line
            rows = [", ".join(atoms[i : i + _LIST_CHUNK]) for i in range(0, len(atoms), _LIST_CHUNK)]
        else:
            rows = [_render(v, inner) for v in value]
        return "[\n" + ",\n".join(inner + r for r in rows) + f"\n{indent}]"
    return _atom(value)


def to_json(mapping: DeviceMapping) -> str:
    """The file's text: proto3 JSON, fields in declaration order, deterministic for equal mappings."""
    msg = to_proto(mapping)
    obj = json_format.MessageToDict(msg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True)
    if not obj["slice"]["chips_per_machine_bounds"]:  # one task per machine: the file an older tpuctl reads too
        del obj["slice"]["chips_per_machine_bounds"]
    if not obj["plan"]:  # every slice of the spec in order: ranks are task ids, as an older tpuctl reads it
        del obj["plan"]
        for task in obj["tasks"]:
            del task["task_id"]
    return _render(_in_field_order(msg.DESCRIPTOR, obj), "") + "\n"


def from_json(text: str, source: str = "device mapping") -> DeviceMapping:
    """Parse and validate a mapping file's text; every problem is a MappingError naming ``source``
    (a ValueError or RecursionError from a hostile file too: wrapped once, never escaping)."""
    try:
        return _from_json(text, source)
    except MappingError as exc:
        if exc.message.startswith(source):
            raise
        raise MappingError(f"{source}: {exc.message}", hint=exc.hint or _REINIT_HINT) from exc
    except RecursionError:
        raise MappingError(f"{source}: nested too deeply: not a device mapping file", hint=_REINIT_HINT) from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise MappingError(f"{source}: not a device mapping: {exc}", hint=_REINIT_HINT) from exc


def _number(text: str) -> NoReturn:
    raise MappingError(f"a number {len(text):,} characters long; expected at most {MAX_NUMBER_CHARS} characters")


def _parse_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        _number(text)
    return int(text)


def _parse_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        _number(text)
    return float(text)


def _parse_constant(text: str) -> NoReturn:
    raise MappingError(f"{text} is not JSON (JSON numbers are finite)")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise MappingError(f"key {key!r} appears twice in one JSON object")
        out[key] = value
    return out


def _unknown_keys(descriptor: Descriptor, obj: Any, path: str) -> list[str]:
    """Keys the schema does not have, with a "did you mean" (json_format's message lists camelCase names)."""
    if not isinstance(obj, dict):
        return []  # json_format reports the type error
    fields = {f.name: f for f in descriptor.fields} | {f.json_name: f for f in descriptor.fields}
    problems = []
    for key, value in obj.items():
        field = fields.get(key)
        where = f"{path}.{key}" if path else key
        if field is None:
            guess = closest(key, [f.name for f in descriptor.fields])
            problems.append(f"unknown field {where!r}" + (f" ({suggestion(guess)})" if guess else ""))
            continue
        sub = field.message_type
        if sub is None or sub.full_name.startswith("google.protobuf."):
            continue
        items = value if field.is_repeated and isinstance(value, list) else [value]
        for i, item in enumerate(items):
            problems += _unknown_keys(sub, item, f"{where}[{i}]" if field.is_repeated else where)
    return problems


def _from_json(text: str, source: str) -> DeviceMapping:
    if not text.strip():
        raise MappingError(f"{source}: the file is empty", hint=_REINIT_HINT)
    try:
        data = json.loads(
            text,
            object_pairs_hook=_no_duplicate_keys,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_parse_constant,
        )
    except json.JSONDecodeError as exc:
        what = "not valid JSON" if text.rstrip().endswith("}") else "truncated"
        raise MappingError(
            f"{source}:{exc.lineno}:{exc.colno}: {what}: {exc.msg}", hint="the file is damaged; " + _REINIT_HINT
        ) from exc
    if not isinstance(data, dict):
        raise MappingError(f"{source}: the file holds a JSON {type(data).__name__}, not a device mapping object")
    version = data.get("schema_version")
    if version is None:
        raise MappingError(f"{source}: no schema_version: this is not a tpuctl device mapping file")
    if version not in KNOWN_SCHEMA_VERSIONS or isinstance(version, bool):
        known = ", ".join(map(str, KNOWN_SCHEMA_VERSIONS))
        raise MappingError(
            f"{source}: schema_version {version!r} is not one this tpuctl reads ({known})",
            hint="it was written by another tpuctl version: use the same version for init and jobs, or " + _REINIT_HINT,
        )
    unknown = _unknown_keys(_pb.DESCRIPTOR, data, "")
    if unknown:
        raise MappingError(
            f"{source}: not the device mapping schema: " + "; ".join(unknown),
            hint="the file was edited or written by another tpuctl version; " + _REINIT_HINT,
        )
    msg = _pb()
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as exc:
        raise MappingError(f"{source}: does not match the device mapping schema: {exc}") from exc
    except (SystemError, UnicodeError) as exc:  # protobuf (upb) on a string holding a lone surrogate ("\ud800")
        raise MappingError(
            f"{source}: a string is not valid Unicode (a lone \\ud800-\\udfff escape): not a device mapping file"
        ) from exc
    mapping = from_proto(msg)
    problems = mapping_problems(mapping) or _mesh_record_problems(msg, mapping)
    if problems:
        raise MappingError(
            f"{source}: inconsistent device mapping ({len(problems)} problem(s))\n"
            + listed(problems, limit=MAX_LISTED),
            hint="the file was edited or is from a different init; " + _REINIT_HINT,
        )
    return mapping


# --- files -----------------------------------------------------------------------------------------


def write_mapping(path: str | os.PathLike[str], mapping: DeviceMapping) -> Path:
    """Write the mapping atomically: a reader sees the old file or the new one, never a partial one.

    :func:`tpuctl.files.atomic_write`: temp file in the same folder, fsync, ``os.replace``, fsync the
    folder. Parent folders are created. The file is mode 0644 whatever the umask (jobs of other users
    read it).
    """
    target = Path(path)
    text = to_json(mapping)  # fail before touching the disk
    try:
        return atomic_write(target, text, mode=SHARED_MODE)
    except OSError as exc:
        raise StateError(f"cannot write device mapping {target}: {exc.strerror or exc}") from exc


def read_mapping(path: str | os.PathLike[str]) -> DeviceMapping:
    """Read and validate the device mapping file at ``path`` (jobs call ``tpuctl.load_mapping()``).

    Refuses (MappingError, exit 7) a missing, empty, truncated or non-JSON file (with line and column), an
    unknown schema_version, fields the schema does not have, and a file whose parts disagree: device
    counts, unique core ids, ``all_core_ids`` vs the tasks, ``device_coordinates`` vs the devices'
    coordinates, and the TopologyProto bytes vs ``mesh_shape``/``device_coordinates``.
    """
    source = os.fspath(path)
    try:
        raw = read_regular_file(source, MAX_MAPPING_BYTES)
    except FileNotFoundError as exc:
        raise MappingError(
            f"no device mapping file at {source}", hint="run `tpuctl init` on this host first, or fix the path"
        ) from exc
    except FileTooLarge:
        raise MappingError(
            f"cannot read device mapping {source}: it is over {MAX_MAPPING_BYTES // 2**20} MiB: not a device mapping file",
            hint=_FILE_HINT,
        ) from None
    except OSError as exc:
        raise MappingError(f"cannot read device mapping {source}: {exc.strerror or exc}", hint=_FILE_HINT) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MappingError(
            f"{source}: not UTF-8 text (byte {exc.start}): not a device mapping file", hint=_REINIT_HINT
        ) from exc
    return from_json(text, source)


_FILE_HINT = "pass the path of the mapping file tpuctl init wrote (a regular file)"
