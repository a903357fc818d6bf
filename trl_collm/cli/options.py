"""The training commands' options (`trl-collm ppo` / `mc`): the parser (`_train_parser`: TRL's TrlParser over the task
arguments, the trainer config and TRL's ModelConfig, its `--help` grouped and the fields a user cannot set hidden),
the YAML keys no option takes, and the kept `--help` texts (this user's copy, or the one shipped in `help_texts/`,
keyed by `_help_key`) that let `--help` and the config-key check skip importing transformers and torch.
"""

from __future__ import annotations

import contextlib
import os
import sys

from .common import TaskArguments, _parser_error, user_errors
from .precheck import check_config_keys, keep_option_names, kept_help_text, kept_names, kept_options, read_config

# ModelConfig's bitsandbytes fields: the team trainers load models without quantization
_QUANTIZATION = (
    "load_in_8bit",
    "load_in_4bit",
    "bnb_4bit_quant_type",
    "use_bnb_nested_quant",
    "bnb_4bit_quant_storage",
)


def _hidden_fields(config_cls) -> set[str]:
    """Fields `--help` leaves out: TrainingArguments fields that are refused unless default or do not apply here
    (trainers/supported_args.py), GRPOConfig's fields that MC parses only to refuse (trainers/grpo_fields.py; TRL's
    script passes them, docs/from-grpo.md lists them) and ModelConfig's quantization flags (refused)."""
    from ..trainers.grpo_fields import GRPORefusedFields
    from ..trainers.supported_args import HONOURED, SUPPORT

    hidden = {name for name, sup in SUPPORT.items() if sup.status != HONOURED} | set(_QUANTIZATION)
    if issubclass(config_cls, GRPORefusedFields):
        hidden |= set(GRPORefusedFields.__dataclass_fields__)
    return hidden


def _group_help(parser, config_cls) -> None:
    """Group `--help` as TRL's scripts read (task, model, the trainer's own fields, inherited training arguments)
    and hide the fields a user cannot use here (they are still parsed, and refused in one line when set)."""
    import argparse
    import dataclasses

    from transformers import TrainingArguments
    from trl import ModelConfig

    hidden = _hidden_fields(config_cls)
    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = {f.name for f in dataclasses.fields(config_cls)} - inherited
    groups = [
        (
            "task",
            "what to train on (trl-collm tasks lists the built-ins)",
            {f.name for f in dataclasses.fields(TaskArguments)},
        ),
        ("model", "TRL's ModelConfig: the agents' model and LoRA", {f.name for f in dataclasses.fields(ModelConfig)}),
        (config_cls.__name__, "the multi-agent trainer's own fields (docs/algorithm.md)", own),
        (
            "training",
            "transformers' TrainingArguments honoured by the team trainers; the refused ones are hidden "
            "(docs/trl-ppo-differences.md lists every field)",
            inherited,
        ),
    ]
    general = parser._action_groups[1]  # argparse's "options" group, where HfArgumentParser put every field
    moved = []
    for title, description, names in groups:
        group = parser.add_argument_group(title, description)
        for action in general._group_actions:
            if action.dest in names and action not in moved:
                group._group_actions.append(action)
                moved.append(action)
    general._group_actions[:] = [a for a in general._group_actions if a not in moved]
    for action in parser._actions:
        if action.dest in hidden:
            action.help = argparse.SUPPRESS


def _train_parser(kind: str, config_cls):
    from trl import ModelConfig, TrlParser

    prog = f"trl-collm {kind}"
    parser = TrlParser((TaskArguments, config_cls, ModelConfig), prog=prog)
    parser.error = _parser_error(prog)
    _group_help(parser, config_cls)
    return parser


def _check_config_keys(kind: str, argv: list[str], parser) -> None:
    """The YAML keys no option takes, said in one line (naming the other trainer when they are its options)."""
    path, config = read_config(argv)
    names = {a.dest for a in parser._actions}
    if path is None or set(config) <= names | {"env"}:
        return
    twin = "mc" if kind == "ppo" else "ppo"
    other = {a.dest for a in _train_parser(twin, _config_cls(twin))._actions}
    check_config_keys(kind, path, config, names, other)


def _parse_training(parser, argv: list[str]):
    with user_errors():
        return parser.parse_args_and_config(argv)


SHIPPED_HELP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "help_texts")


def _help_key(kind: str) -> str:
    """The name of `trl-collm KIND --help`'s kept text: keyed by the trl / transformers versions and the contents of
    the files that define the options, so that a text is only ever read back for the parser it came from."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # trl_collm/
    key = [kind]
    for pkg in ("trl", "transformers"):
        try:
            key.append(version(pkg))
        except PackageNotFoundError:
            key.append("-")
    options = ("cli/options.py", "cli/common.py", "trainers/team_config.py", "trainers/backend_fields.py")
    options += (f"trainers/{kind}_config.py",)
    digest = hashlib.sha256("|".join(key).encode())
    for rel in (*options, "trainers/supported_args.py"):
        with open(os.path.join(here, rel), "rb") as f:
            digest.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return f"{kind}-{digest.hexdigest()[:16]}.txt"


def _help_cache_file(kind: str, key: str | None = None) -> str:
    """Where this user's `trl-collm KIND --help` is kept (written by the first parser build; `key`: its
    `_help_key`, when already computed). Building the parser imports transformers and torch (seconds; over a minute
    on a cold, busy machine), reading the text does not."""
    root = os.environ.get("TRL_COLLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "trl_collm")
    return os.path.join(root, "help", key or _help_key(kind))


def _help_file(kind: str) -> str:
    """The kept text to read: this user's, else the one shipped in the package for the same key (written by
    tools/ship_help_texts.py, so a fresh install's first --help and config-key check skip the heavy imports too),
    else the user's path (absent: the parser gets built)."""
    key = _help_key(kind)  # reads and hashes the option files: once per call
    mine = _help_cache_file(kind, key)
    shipped = os.path.join(SHIPPED_HELP_DIR, key)
    if not os.path.isfile(mine) and os.path.isfile(shipped) and not os.environ.get("TRL_COLLM_NO_SHIPPED_HELP"):
        return shipped
    return mine


def _keep_parser(kind: str, parser=None) -> str:
    """Keep `trl-collm KIND --help`'s text and option names (building the parser when not given); returns the
    text. Whoever builds a parser keeps both commands' (the second costs a fraction of a second once transformers
    is imported), so later --help calls and config-key checks of either command skip the heavy imports."""
    path = _help_cache_file(kind)
    parser = parser or _train_parser(kind, _config_cls(kind))
    keep_option_names(path, parser, *field_choices(kind))
    text = parser.format_help()
    with contextlib.suppress(OSError):  # a read-only home only costs the next --help its seconds
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + f".{os.getpid()}", "w") as f:
            f.write(text)
        os.replace(path + f".{os.getpid()}", path)
    return text


def _keep_both(kind: str, parser) -> None:
    _keep_parser(kind, parser)
    twin = "mc" if kind == "ppo" else "ppo"
    twin_file = _help_file(twin)
    if kept_help_text(twin_file, twin) is None or kept_names(twin_file) is None or kept_options(twin_file) is None:
        _keep_parser(twin)


def _print_help(kind: str) -> None:
    text = kept_help_text(_help_file(kind), kind)
    if text is None:  # never kept, or the kept file is damaged: build the parser and keep its text again
        parser = _train_parser(kind, _config_cls(kind))
        _keep_both(kind, parser)
        text = parser.format_help()
    print(text, end="")


def field_choices(kind: str) -> tuple[dict, dict]:
    """The trainer config's own choice fields (TEAM_CHOICES and its module's `*CHOICES` tables, checked in its
    `_validate`) for the flag check before the parser, and the values it refuses with a message of its own (MC's
    GRPO loss types that are not here: it names the nearest)."""
    from ..trainers.team_config import TEAM_CHOICES

    module = sys.modules[_config_cls(kind).__module__]
    choices = dict(TEAM_CHOICES)
    for name, table in vars(module).items():
        if name.endswith("CHOICES") and isinstance(table, dict):
            choices.update(table)
    choices = {k: list(v) for k, v in choices.items() if all(isinstance(c, str) for c in v)}
    explained = {}
    if kind == "mc":
        from ..trainers.grpo_fields import OTHER_GRPO_LOSS_TYPES

        explained["loss_type"] = sorted(OTHER_GRPO_LOSS_TYPES)
    return choices, explained


def _config_cls(kind: str):
    if kind == "ppo":
        from ..trainers.ppo_config import MultiAgentPPOConfig

        return MultiAgentPPOConfig
    from ..trainers.mc_config import MultiAgentMCConfig

    return MultiAgentMCConfig
