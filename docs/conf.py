"""Sphinx configuration: MyST Markdown pages, the options reference and hook specs read from the plugin."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "pytest-collectives"
extensions = ["myst_parser", "sphinx.ext.autodoc", "plugin_reference"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links resolve, and a broken one is a warning
myst_enable_extensions = ["colon_fence"]
autodoc_typehints = "description"
html_theme = "alabaster"
html_title = project
suppress_warnings: list[str] = []
