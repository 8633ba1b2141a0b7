"""Sphinx configuration: MyST Markdown pages (their reference sections are written into them from the
plugin by _ext/plugin_reference.py)."""

project = "pytest-collectives"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3  # [text](page.md#a-heading) links resolve, and a broken one is a warning
myst_enable_extensions = ["colon_fence"]
html_theme = "alabaster"
html_title = project
suppress_warnings: list[str] = []
