"""The HTML pages (report.html, fleet.html) rendered from the Jinja templates in templates/.

Callers pass plain data; the templates do the markup. Autoescape is on for every template, so a value from a
report reaches the page escaped unless it goes through `code`, which escapes it first too. Nothing from the
data is ever marked safe as it is.
"""

from __future__ import annotations

import re
from typing import Any

import jinja2
from markupsafe import Markup, escape

_BACKTICKED = re.compile(r"`([^`<>]+)`")


def code(value: Any) -> Markup:
    """`value` escaped, with its `backticked` words shown as code: reasons quote commands that way."""
    # str() first: a Markup value would otherwise pass unescaped, and no caller means to trust one.
    return Markup(_BACKTICKED.sub(r"<code>\1</code>", str(escape(str(value)))))


_ENVIRONMENT = jinja2.Environment(
    loader=jinja2.PackageLoader("pytest_collectives.nodereport.outputs", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_ENVIRONMENT.filters["code"] = code


def render(template: str, **context: Any) -> str:
    """The page of `template` (a file name under templates/) filled with `context`."""
    return _ENVIRONMENT.get_template(template).render(**context)
