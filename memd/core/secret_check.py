"""The one question the summary code asks about credentials: "is this one?" (pure).

The privacy work owns the credential detector (``memd/core/secrets.py``); until
it lands, this is the single place pins and prompts ask, so switching to it is a
one-line change here rather than a second detector elsewhere.
"""

from __future__ import annotations

import re
from typing import Final

_CREDENTIAL_RE: Final = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r"|\b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}"
    r"|\bsk-ant-[A-Za-z0-9_-]{16,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"
    r"|\bAIza[0-9A-Za-z_-]{35}\b"
    r"|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
    r"|\b(?:bearer|token)\s+[A-Za-z0-9._~+/-]{20,}"
    r"|(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?key|token)\s*[:=]\s*\S{6,}"
    r"|://[^/\s:@]+:[^/\s@]{3,}@",
    re.IGNORECASE,
)


def looks_like_credential(text: str) -> bool:
    """True when ``text`` holds something shaped like a secret (never pin or repeat it)."""
    return bool(_CREDENTIAL_RE.search(text))
