"""How one node reaches another over SSH, node to node: the one command `sparktop sync` (rsync, `docker load`)
and `sparktop setup` (the nodes' ssh to each other) both run on the source node.

`$RSYNC_RSH` where set on the source (rsync's own variable: an ssh with its options), else `ssh`, always with
`BatchMode=yes`: a host key the source does not know, or a key the target refuses, fails at once with ssh's
own reason; nothing here asks a question or accepts a key.
"""

from __future__ import annotations

import shlex


def ssh_command(port: int | None = None) -> str:
    """The ssh the source runs to reach another node, as shell words (`$RSYNC_RSH` expanded on the source)."""
    # ${RSYNC_RSH:-ssh} is left unquoted on purpose: it holds a command and its options, split into words.
    return "${RSYNC_RSH:-ssh} -o BatchMode=yes" + (f" -p {int(port)}" if port else "")


def check_command(address: str, port: int | None = None) -> str:
    """Does the source reach `address` ([user@]host) with key authentication and a host key it knows?"""
    return f"{ssh_command(port)} -o ConnectTimeout=5 {shlex.quote(address)} true"


def config_command(address: str, port: int | None = None) -> str:
    """The source's effective ssh settings for `address` (`ssh -G`: identityfile, userknownhostsfile, hostname,
    port, hostkeyalias), read where the files a fix writes are (the ssh config, not a guess)."""
    return f"{ssh_command(port)} -G {shlex.quote(address)}"
