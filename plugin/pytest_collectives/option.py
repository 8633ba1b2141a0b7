"""The one shape every option of the plugin is declared in, and how its value is read.

Each concern declares its options in its settings module as a tuple of ``Option`` and reads them there,
once, when pytest configures; a bad value raises ``errors.OptionError``, which the entry point
(``hooks.pytest_configure``) turns into pytest's one-line usage error, the one path every bad value takes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest


@dataclasses.dataclass(frozen=True)
class Option:
    """A command-line flag ``--name-with-dashes`` and, where ``ini`` names its type, an ini setting of the
    same name; ``flag=False``: the ini setting alone."""

    name: str  # "baseline_keep": the ini setting's name, and the flag's with dashes
    help: str
    metavar: str | None = None
    default: Any = None  # with an ini setting, the ini's default (the flag's is None: not given)
    action: str = "store"  # "store", "store_true", or "append" (repeatable; an ini value has one a line)
    ini: str | None = None  # the ini setting's type: "string", "paths"; None: a flag alone
    flag: bool = True
    dest: str = ""  # where the flag's value lands (config.getoption); default: the name

    @property
    def flag_text(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def destination(self) -> str:
        return self.dest or self.name

    def add(self, parser: pytest.Parser, group: Any) -> None:
        if self.flag:
            kwargs: dict[str, Any] = {"dest": self.destination, "action": self.action, "help": self.help}
            if self.ini:
                kwargs["help"] += f"; ini: {self.name}"
            kwargs["default"] = None if self.ini else self.default
            if self.metavar:
                kwargs["metavar"] = self.metavar
            group.addoption(self.flag_text, **kwargs)
        if self.ini:
            default = self.default if self.default is not None else ([] if self.ini == "paths" else "")
            parser.addini(
                self.name, self.help, type=None if self.ini == "string" else self.ini, default=default
            )

    def value(self, config: pytest.Config) -> Any:
        """The flag's value where given, else the ini setting's (the command line wins)."""
        given = config.getoption(self.destination) if self.flag else None
        if given is not None or not self.ini:
            return given
        return config.getini(self.name)

    def text(self, config: pytest.Config) -> str:
        """The value as the text its reader parses: a repeatable flag's values one a line, as in the ini."""
        value = self.value(config)
        if isinstance(value, list):
            value = "\n".join(map(str, value))
        return str(value if value is not None else "").strip()


def declare(parser: pytest.Parser, group: Any, *families: tuple[Option, ...]) -> None:
    for options in families:
        for option in options:
            option.add(parser, group)
