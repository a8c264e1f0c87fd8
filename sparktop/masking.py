"""Secrets out of command lines before they reach study.json or a report."""

from __future__ import annotations

import re

_SECRET = re.compile(
    r"(?P<key>--(?:api[-_]key|hf[-_]token|token|password|secret)(?:=|\s+)"  # --api-key X, --token=X
    r"|\b[A-Z][A-Z0-9_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD)[A-Z0-9_]*="  # HF_TOKEN=..., OPENAI_API_KEY=...
    r"|\b(?:authorization|Authorization|AUTHORIZATION):\s*(?:Bearer\s+)?)"
    r"(?P<value>\"[^\"]*\"|'[^']*'|[^\s'\"]+)")
_BARE = re.compile(r"\b(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|ghp_[A-Za-z0-9]{20,})\b")


def mask(command: str) -> str:
    """A command line fit for a report: every secret-looking value replaced
    by *** (the runner masks them already; this is the second lock)."""
    def hide(m: re.Match) -> str:
        value = m.group("value")
        return m.group("key") + ("***" if value.strip("'\"") != "***" else value)

    return _BARE.sub("***", _SECRET.sub(hide, command))


_URL_SECRET = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@")  # http://user:pw@host


def mask_argv(argv: list[str]) -> list[str]:
    """A server's command line, token by token, with its secrets replaced by *** (the value after
    `--api-key`, `--api-key=X`, `HF_TOKEN=X`, credentials in a URL): what a snapshot may carry and show."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next and not token.startswith("--"):
            out.append("***")
            hide_next = False
            continue
        hide_next = bool(_SECRET.fullmatch(token + " x")) and "=" not in token  # a flag whose value follows
        token = _URL_SECRET.sub(lambda m: m.group("scheme") + "***@", token)
        out.append(mask(token) if "=" in token or _BARE.search(token) else token)
    return out


_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s]*@")


def strip_url_credentials(text: str) -> str:
    """`text` with the credentials of every URL in it removed (http://user:pw@host:8000 -> http://host:8000):
    what a file that outlives the command (the history) may keep."""
    return _URL_USERINFO.sub(lambda m: m.group("scheme"), text) if "@" in text else text


def without_credentials(url: str) -> str:
    """One URL without the `user:password@` it may carry, a scheme or not (`user:pw@host:8000` ->
    `host:8000`, an `@` in the password too): what names an engine wherever it is shown, kept or exported."""
    if "@" not in url:
        return url
    if "://" in url:
        return strip_url_credentials(url)
    return strip_url_credentials("x://" + url)[len("x://"):]
