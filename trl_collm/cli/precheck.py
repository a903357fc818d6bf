"""What `trl-collm ppo|mc` checks before it builds its parser: building it imports transformers, TRL and torch
(about 5 s of CPU, minutes on a loaded machine), so a mistake found from the YAML file and the flags alone costs
only a YAML parse. In order: the config file, a local model folder, the config's keys (against the option names
the last parser build kept), the flags (their names, arity, types and choices, as that build kept them: `check_flags`
says what the parser would, in its words), the task's name (the built-in catalogue), then the task itself and its
options (its module imports torch, not transformers). What needs the parser is checked after it, as before."""

from __future__ import annotations

import json
import os
import re

from .common import TINY, UsageError, _check_options, _get_task, _options, check_model_path


def read_config(argv: list[str]) -> tuple[str | None, dict]:
    """The --config path and its mapping ({} without one); a missing or malformed file is one line."""
    path = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"), None)
    path = path or next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None:
        return None, {}
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror or e}; give the path of a YAML config file") from e
    except yaml.YAMLError as e:  # the message holds the line and column
        raise UsageError(f"--config {path}: not valid YAML: {e}; fix that line") from e
    if data is not None and not isinstance(data, dict):
        raise UsageError(
            f"--config {path}: the file must hold `field: value` lines (a YAML mapping), not a {type(data).__name__}"
        )
    return path, data or {}


def flag_value(argv: list[str], name: str, config: dict):
    """The value a flag gets: its last `--name VALUE` / `--name=VALUE` on the command line, else the config's."""
    value = config.get(name)
    for i, a in enumerate(argv):
        if a == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
    return value


def names_file(help_file: str) -> str:
    """Beside the kept `--help` text (same key: package versions and the files that define the options)."""
    return help_file[: -len(".txt")] + ".names.json"


def options_file(help_file: str) -> str:
    """Beside the kept `--help` text: each flag's arity, type and choices (`check_flags`)."""
    return help_file[: -len(".txt")] + ".options.json"


def _write_json(path: str, data) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + f".{os.getpid()}", "w") as f:
            json.dump(data, f)
        os.replace(path + f".{os.getpid()}", path)
    except OSError:  # a read-only home only skips the checks they allow
        pass


_TYPES = {int: "int", float: "float"}


def keep_option_names(help_file: str, parser, field_choices: dict | None = None, explained: dict | None = None) -> None:
    """Keep the parser's option names for the next call's config-key check, and each flag's arity, type and choices
    for its flag check; `field_choices`: the config's own choice fields (checked in its `_validate`, not by argparse),
    `explained`: values of those the config refuses with a message of its own (left to it)."""
    _write_json(names_file(help_file), sorted({a.dest for a in parser._actions} - {"help"}))
    options = {}
    for action in parser._actions:
        kind = _TYPES.get(action.type) or ("bool" if getattr(action.type, "__name__", "") == "string_to_bool" else None)
        choices = [str(c) for c in action.choices] if action.choices is not None else None
        for flag in action.option_strings:
            if flag.startswith("--") and action.dest != "help":
                spec = {"dest": action.dest, "names": "/".join(action.option_strings), "type": kind}
                options[flag] = dict(spec, nargs=action.nargs, choices=choices)
    kept = {
        "options": options,
        "negative_number": parser._negative_number_matcher.pattern,
        "field_choices": {k: [str(c) for c in v] for k, v in (field_choices or {}).items()},
        "explained": {k: [str(c) for c in v] for k, v in (explained or {}).items()},
    }
    _write_json(options_file(help_file), kept)


# Options every training command has: a kept names file without them is not a parser's (damaged, or written by
# something else), and trusting it would call valid config keys "not an option".
_CORE_OPTIONS = frozenset({"task", "output_dir", "model_name_or_path", "learning_rate"})


def kept_names(help_file: str) -> set[str] | None:
    """The option names the last parser build kept, or None (then the parser checks): a missing or unreadable
    file, and one that holds anything but a list of names including the core options (`null`, a number, a dict, a
    string, `[]`), count as not kept."""
    try:
        with open(names_file(help_file)) as f:
            names = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return set(names) if _CORE_OPTIONS <= set(names) else None


def kept_help_text(help_file: str, kind: str) -> str | None:
    """The kept `trl-collm KIND --help` text, or None (then the parser is built and the text kept again): a
    missing or unreadable file, and one that is not such a text (empty, cut short, another command's)."""
    try:
        with open(help_file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    ok = text.startswith(f"usage: trl-collm {kind} ") and all(f"--{o}" in text for o in _CORE_OPTIONS)
    return text if ok else None


def _text_lists(table) -> bool:
    return isinstance(table, dict) and all(
        isinstance(v, list) and all(isinstance(c, str) for c in v) for v in table.values()
    )


def kept_options(help_file: str) -> dict | None:
    """What `keep_option_names` kept of each flag, or None (then the parser checks the flags): a missing or
    unreadable file, or one not of that shape or without the core options, counts as not kept."""
    try:
        with open(options_file(help_file)) as f:
            kept = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or not isinstance(kept.get("options"), dict):
        return None
    specs = kept["options"].values()
    shape = all(
        isinstance(s, dict)
        and isinstance(s.get("dest"), str)
        and isinstance(s.get("names"), str)
        and s.get("type") in (None, "int", "float", "bool")
        and (s.get("nargs") is None or isinstance(s.get("nargs"), (str, int)))
        and (s.get("choices") is None or _text_lists({"c": s.get("choices")}))
        for s in specs
    )
    tables = _text_lists(kept.get("field_choices")) and _text_lists(kept.get("explained"))
    core = {f"--{o}" for o in _CORE_OPTIONS} <= set(kept["options"])
    if not (shape and tables and core and isinstance(kept.get("negative_number"), str)):
        return None
    return kept


def check_config_keys(kind: str, path: str, config: dict, names: set[str], other: set[str] | None) -> None:
    """Keys of the YAML file that no option of `trl-collm KIND` takes; `other`: the other trainer's option names,
    to say "this is a ppo config" instead of TRL's "set fail_with_unknown_args=False"."""
    unknown = sorted(set(config) - names - {"env"})  # `env`: TrlParser's environment variables section
    if not unknown:
        return
    listed = ", ".join(f"`{k}`" for k in unknown)
    twin = "mc" if kind == "ppo" else "ppo"
    if other is not None and set(unknown) <= other:
        raise UsageError(
            f"--config {path}: {listed} {'is' if len(unknown) == 1 else 'are'} not an option of trl-collm {kind} "
            f"but of trl-collm {twin}: run `trl-collm {twin} --config {path}`, or remove {listed} from the file"
        )
    raise UsageError(
        f"--config {path}: {listed} {'is' if len(unknown) == 1 else 'are'} not an option of trl-collm {kind}; "
        f"remove {'it' if len(unknown) == 1 else 'them'} from the file (trl-collm {kind} --help lists the options)"
    )


def check_task_name(name: str) -> None:
    """A built-in name or an import path passes at once (the catalogue: no task module imported)."""
    from ..tasks import is_import_path, known_task_names

    known = known_task_names()
    if is_import_path(name) or name in known:
        return
    raise UsageError(
        f"unknown task {name!r}; choose one of {sorted(known)}, or give your own as MODULE:NAME (`trl-collm tasks` "
        "says how)"
    )


def _agent_models(argv: list[str], config: dict) -> list[str]:
    """`--agent_models A B ...` (every value up to the next flag) or the config's list."""
    values = config.get("agent_models") or []
    values = [values] if isinstance(values, str) else list(values)
    for i, a in enumerate(argv):
        if a == "--agent_models":
            values = []
            for v in argv[i + 1 :]:
                if v.startswith("--"):
                    break
                values.append(v)
    return [v for v in values if isinstance(v, str)]


_BOOLS = {"yes", "true", "t", "y", "1", "no", "false", "f", "n", "0"}  # transformers' string_to_bool


def check_flags(kind: str, argv: list[str], config: dict, kept: dict, other: dict | None) -> None:
    """The command line's flags as the parser would take them, said in its words before it is built: an unknown
    flag (the other trainer's, or the nearest name), a flag without its value, a value of the wrong type or not
    among its choices, and a config field's value outside its choices (the config's own message). A flag that
    abbreviates an option is left to the parser (argparse takes unique prefixes)."""
    prog, options = f"trl-collm {kind}", kept["options"]
    negative = re.compile(kept["negative_number"])

    def is_flag(token: str) -> bool:  # argparse's rule: '-' then not a negative number and no space
        return token.startswith("-") and len(token) > 1 and not negative.match(token) and " " not in token

    def fail(message: str):
        return UsageError(f"{prog}: {message} ({prog} --help lists the options)")

    chosen = {k: v for k, v in config.items() if isinstance(v, str)}
    i = 0
    while i < len(argv):
        token, i = argv[i], i + 1
        if not is_flag(token):
            continue  # a stray value: the parser says it
        flag, eq, inline = token.partition("=")
        if flag == "--config":  # TrlParser's own
            i += 0 if eq else 1
            continue
        spec = options.get(flag)
        if spec is None:
            if flag.startswith("--") and any(known.startswith(flag) for known in options):
                return  # an abbreviation: argparse decides, and where the values after it end
            raise _unknown_flag(kind, flag, options, other, fail)
        if spec["nargs"] == 0:
            continue
        given = [inline] if eq else []
        while not eq and i < len(argv) and not is_flag(argv[i]) and (spec["nargs"] in ("+", "*") or not given):
            given, i = [*given, argv[i]], i + 1
        if not given and spec["nargs"] in (None, "+"):
            raise fail(
                f"argument {spec['names']}: expected {'one' if spec['nargs'] is None else 'at least one'} argument"
            )
        for value in given:
            _check_value(spec, value, fail)
        if given:
            chosen[spec["dest"]] = given[-1]
    for dest, allowed in kept["field_choices"].items():
        value = chosen.get(dest)
        if value is not None and value not in allowed and value not in kept["explained"].get(dest, ()):
            raise UsageError(f"`{dest}`={value!r} is not valid; choose one of {allowed}.")


def _check_value(spec: dict, value: str, fail) -> None:
    kind = spec["type"]
    if kind == "bool" and value.lower() not in _BOOLS:
        raise fail(
            f"argument {spec['names']}: Truthy value expected: got {value} but expected one of yes/no, true/false, "
            "t/f, y/n, 1/0 (case insensitive)."
        )
    if kind in ("int", "float"):
        try:
            (int if kind == "int" else float)(value)
        except ValueError:
            raise fail(f"argument {spec['names']}: invalid {kind} value: {value!r}") from None
    if spec["choices"] is not None and value not in spec["choices"]:
        listed = ", ".join(repr(c) for c in spec["choices"])
        raise fail(f"argument {spec['names']}: invalid choice: {value!r} (choose from {listed})")


def _unknown_flag(kind: str, flag: str, options: dict, other: dict | None, fail) -> UsageError:
    twin = "mc" if kind == "ppo" else "ppo"
    if other is not None and flag in other["options"]:
        return UsageError(
            f"{flag} is not an option of trl-collm {kind} but of trl-collm {twin}: run `trl-collm {twin} ...` with "
            "it, or drop it"
        )
    import difflib

    names = sorted(f for f in options if "-" not in f[2:])
    near = difflib.get_close_matches(flag.replace("-", "_").replace("__", "--", 1), names, n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    return fail(f"{flag} is not an option{hint}")


def precheck(kind: str, argv: list[str], help_file_of) -> None:
    """Everything `train` can check before its parser is built. `help_file_of(kind)` names the kept --help text."""
    path, config = read_config(argv)
    model = flag_value(argv, "model_name_or_path", config)
    if isinstance(model, str) and model != TINY:
        check_model_path(model, "--model_name_or_path")
    for agent_model in _agent_models(argv, config):  # each one, before the first (`tiny`) is built
        if agent_model != TINY:
            check_model_path(agent_model, "--agent_models")
    names = kept_names(help_file_of(kind))
    other = kept_names(help_file_of("mc" if kind == "ppo" else "ppo"))
    if path is not None and names is not None and other is not None:  # else the parsers' own check says it
        check_config_keys(kind, path, config, names, other)
    kept = kept_options(help_file_of(kind))
    if kept is not None:  # else the parser checks the flags
        check_flags(kind, argv, config, kept, kept_options(help_file_of("mc" if kind == "ppo" else "ppo")))
    task_name = flag_value(argv, "task", config) or "coord-penalty"  # TaskArguments' default
    check_task_name(str(task_name))
    opts = _options(flag_value(argv, "task_options", config))
    if opts:  # the task's module imports torch (2 s of CPU), not transformers: only when there is something to check
        _check_options(_get_task(str(task_name)), opts)
