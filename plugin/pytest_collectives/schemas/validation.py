"""Validating a document against one of the package's schemas, reported as one line naming the bad field.

`first_error(value, schema)` is the message for the first error jsonschema finds (in a stable order: by the
field's path, indices numerically), or None when `value` is valid. A message is "<field> <what is wrong>",
e.g. `runs[0].rounds must be >= 1, got 0`; the caller says how a field is shown (`name`) and adds the
context (which file, what to do).

The validator is Draft 2020-12 with two stricter types than JSON's: a number must be finite (Python's json
reads and writes NaN and Infinity, which no other reader accepts) and a bool is not an integer.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jsonschema


def _finite(checker: Any, value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(checker: Any, value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@functools.cache
def _validator_class() -> type[jsonschema.protocols.Validator]:
    # Imported on first use: jsonschema takes a tenth of a second to import, and every pytest session
    # imports the gate while few of them load a baseline.
    import jsonschema

    return jsonschema.validators.extend(
        jsonschema.Draft202012Validator,
        type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
            {"number": _finite, "integer": _integer}
        ),
    )


def shown(value: Any) -> str:
    """`value` for a message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def field_path(path: Sequence[str | int]) -> str:
    """A path inside a document as messages show it: `runs[0].benchmarks.x`."""
    return "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in path).lstrip(".")


def plain_name(field: str) -> str:
    """The default way `first_error` shows a field: its path as is, `(top level)` for the document."""
    return field or "(top level)"


def message(error: jsonschema.ValidationError, name: Callable[[str], str] = plain_name) -> str:
    """One line saying which field `error` is about (shown by `name`, given its dotted path) and why."""
    path = field_path(error.absolute_path)
    prefix = f"{path}." if path else ""
    field = name(path)
    kind, expected, value = error.validator, error.validator_value, error.instance
    if kind == "type":
        names = [expected] if isinstance(expected, str) else list(expected)
        return f"{field} must be {' or '.join(names)}, got {shown(value)}"
    if kind == "enum":
        return f"{field} must be one of {', '.join(json.dumps(o) for o in expected)}, got {shown(value)}"
    if kind == "required":
        return f"{name(prefix + next(k for k in expected if k not in value))} is missing"
    if kind == "additionalProperties":
        known = list(error.schema.get("properties", {}))
        extra = sorted(k for k in value if k not in known)[0]
        return f"{name(prefix + extra)} is not a known field (known: {', '.join(known)})"
    if kind == "minItems":
        return f"{field} must have at least {expected} item(s)"
    if kind == "minProperties":
        more = "not be empty" if expected == 1 else f"have {expected} entries or more"
        return f"{field} must {more}"
    if kind == "minLength":
        return f"{field} must not be empty"
    if kind == "minimum":
        return f"{field} must be >= {expected}, got {shown(value)}"
    if kind == "exclusiveMinimum":
        return f"{field} must be > {expected}, got {shown(value)}"
    if kind == "pattern":
        # The title says in words what the pattern means, e.g. "git commit hash".
        title = error.schema.get("title")
        what = f" ({title})" if title else ""
        return f"{field} must match {expected}{what}, got {shown(value)}"
    return f"{field}: {error.message}"


def _order(error: jsonschema.ValidationError) -> list[tuple[int, int | str]]:
    # Indices compare as numbers (runs[2] before runs[10]); ties keep jsonschema's order, the schema's.
    return [(0, key) if isinstance(key, int) else (1, key) for key in error.absolute_path]


def first_error(value: Any, schema: Mapping[str, Any], name: Callable[[str], str] = plain_name) -> str | None:
    """The one-line message (see `message`) of the first field of `value` that `schema` rejects, or None."""
    errors = sorted(_validator_class()(schema).iter_errors(value), key=_order)
    return message(errors[0], name) if errors else None
