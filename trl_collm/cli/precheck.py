"""What `trl-collm ppo|mc` checks before it builds its parser: building it imports transformers, TRL and torch
(about 5 s of CPU, minutes on a loaded machine), so a mistake found from the YAML file and the flags alone costs
only a YAML parse. In order: the config file, a local model folder, the config's keys (against the option names
the last parser build kept), the task's name (the built-in catalogue), then the task itself and its options (its
module imports torch, not transformers). What needs the parser is checked after it, as before."""

from __future__ import annotations

import json
import os

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


def keep_option_names(help_file: str, parser) -> None:
    """Keep the parser's option names for the next call's config-key check (a read-only home only skips it)."""
    path = names_file(help_file)
    names = sorted({a.dest for a in parser._actions} - {"help"})
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + f".{os.getpid()}", "w") as f:
            json.dump(names, f)
        os.replace(path + f".{os.getpid()}", path)
    except OSError:
        pass


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
    task_name = flag_value(argv, "task", config) or "coord-penalty"  # TaskArguments' default
    check_task_name(str(task_name))
    opts = _options(flag_value(argv, "task_options", config))
    if opts:  # the task's module imports torch (2 s of CPU), not transformers: only when there is something to check
        _check_options(_get_task(str(task_name)), opts)
