"""The one cl100k_base counter the tests share (loaded offline, like memd loads it)."""

from __future__ import annotations

from memd.tokenizer import TokenCounter

CL100K = TokenCounter("cl100k_base")
