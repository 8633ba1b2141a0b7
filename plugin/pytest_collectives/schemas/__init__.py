"""The JSON Schemas published with the package, for tools that read what it writes."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_schema(name: str) -> dict[str, Any]:
    return json.loads(resources.files(__name__).joinpath(name).read_text(encoding="utf-8"))
