"""Turn transformers' LOAD REPORT for a value model made from a causal LM into one line that says what it means.

`AutoModelForSequenceClassification.from_pretrained(<a causal LM>)` is how a separate critic is built: the LM head
is not used (UNEXPECTED) and the `score` head is new (MISSING, randomly initialised). That is expected, but
transformers prints it as a table that reads like an error, once per value model (twice for a decentralized
critic). This filter drops exactly that report (every unexpected key under `lm_head.`, every missing key under
`score.`) and logs one line instead, once per process. Any other load report is left untouched.
"""

from __future__ import annotations

import logging
import re

LOGGER_NAME = "transformers.modeling_utils"
EXPLANATION = (
    "trl-collm: value model(s) built from a causal LM: the value head `score` is new (random init, trained as the "
    "critic) and the unused LM head is dropped. This is expected; transformers' load report for it is hidden."
)
_ROW = re.compile(r"^\s*([\w.\-]+)\s*\|\s*(?:\x1b\[[0-9;]*m)?(MISSING|UNEXPECTED|MISMATCH\w*|CONVERSION\w*)\b")


def is_value_head_report(message: str) -> bool:
    """True for a LOAD REPORT of a *ForSequenceClassification model whose only findings are a missing `score.*`
    head and unexpected `lm_head.*` weights."""
    first = message.split("\n", 1)[0]
    if "LOAD REPORT" not in first or "ForSequenceClassification" not in first:
        return False
    rows = [m.groups() for m in map(_ROW.match, message.splitlines()) if m]
    if not rows or not any(status == "MISSING" for _, status in rows):
        return False
    return all(
        (status == "MISSING" and key.startswith("score.")) or (status == "UNEXPECTED" and key.startswith("lm_head."))
        for key, status in rows
    )


class ValueHeadReportFilter(logging.Filter):
    def __init__(self):
        super().__init__()
        self.explained = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not is_value_head_report(record.getMessage()):
            return True
        if not self.explained:
            self.explained = True
            record.msg, record.args = EXPLANATION, ()
            return True
        return False


def install_value_head_report_filter() -> None:
    """Attach the filter to transformers' model-loading logger (by name: transformers need not be imported yet)."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, ValueHeadReportFilter) for f in logger.filters):
        logger.addFilter(ValueHeadReportFilter())
