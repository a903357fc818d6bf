"""Write `trl-collm ppo --help` and `trl-collm mc --help` (and their option names) into trl_collm/cli/help_texts/,
keyed like the user's kept copies (trl / transformers versions + the option files' contents), so that a fresh
install's first `--help` and config-key check read them instead of importing transformers and torch.

    python tools/ship_help_texts.py

Run it after changing an option (tests/test_cli_help_texts.py fails until then). Texts are formatted 80 columns
wide, as argparse formats them without a terminal. With other trl / transformers versions installed the key differs
and the CLI builds the parser (and keeps its own copy), so a stale text is never shown.
"""

from __future__ import annotations

import glob
import os
import sys

os.environ["COLUMNS"] = "80"
# TRL's `exp_name` defaults to the running script's name, read when trl is imported: show the command's name.
sys.argv[0] = "trl-collm.py"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from trl_collm.cli import SHIPPED_HELP_DIR, _config_cls, _help_key, _train_parser, field_choices  # noqa: E402
from trl_collm.cli.precheck import keep_option_names  # noqa: E402


def main() -> None:
    os.makedirs(SHIPPED_HELP_DIR, exist_ok=True)
    for old in glob.glob(os.path.join(SHIPPED_HELP_DIR, "*-*.*")):
        os.remove(old)
    for kind in ("ppo", "mc"):
        parser = _train_parser(kind, _config_cls(kind))
        path = os.path.join(SHIPPED_HELP_DIR, _help_key(kind))
        with open(path, "w") as f:
            f.write(parser.format_help())
        keep_option_names(path, parser, *field_choices(kind))
        print(os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
