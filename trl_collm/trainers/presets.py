"""Presets as defaults: a field a preset may fill carries its default wrapped in `PresetDefault`, so "explicit wins"
holds by construction.

A config's constructor only ever sees values. A value the caller gave, whatever it equals, is a plain value; a field
the caller left alone still holds the dataclass default object, the `PresetDefault` itself. That is true on every
path without asking who called: keyword arguments, `HfArgumentParser` (argparse hands a flag's parsed value, but a
flag not given keeps the non-string default object untouched), `TrlParser` (its YAML keys become argparse defaults,
plain values) and `dataclasses.replace` (every field a resolved, plain value, so a preset is never applied twice).
`fill_preset_defaults` then replaces each wrapper with the preset's value or, without one, the plain default.
"""

from __future__ import annotations

import dataclasses


class PresetDefault:
    """The default of a field a preset may fill. It prints as its value (`--help`, signatures, docs)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def plain(value):
    """A field's value with a `PresetDefault` unwrapped (for code that reads a default or a value not yet filled)."""
    return value.value if isinstance(value, PresetDefault) else value


def fill_preset_defaults(config, preset_values: dict) -> None:
    """Give every field still holding its `PresetDefault` the preset's value, or its plain default."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if isinstance(value, PresetDefault):
            setattr(config, f.name, preset_values.get(f.name, value.value))


def check_presettable(config_cls: type, presets: dict) -> None:
    """Refuse (at import) a preset naming a field whose default is not a `PresetDefault`: it could not tell a user's
    value from the default, so it would be silently ignored or silently override the user."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    for name, values in presets.items():
        for key in values:
            if key not in defaults:
                raise TypeError(f"preset {name!r} sets {key!r}, which is not a field of {config_cls.__name__}.")
            if not isinstance(defaults[key], PresetDefault):
                raise TypeError(
                    f"preset {name!r} sets {key!r}, whose default in {config_cls.__name__} is not a "
                    "PresetDefault; declare it with default=PresetDefault(...)."
                )
