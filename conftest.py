"""Repository-wide pytest configuration.

The plugin itself is registered through its ``pytest11`` entry point (``pip install -e .``); pytester
drives it from the plugin's own tests in ``tests/``.
"""

pytest_plugins = ["pytester"]
