"""A node's SSH host key, read before it is trusted, and trusted only when someone says so.

`SSHTransport` refuses a host whose key is not in known_hosts (`HostKeyError`). `sparktop setup` then reads
the key the host presents (`host_key`: the handshake only, no authentication), shows its SHA256 fingerprint
as `ssh` does, and appends it to known_hosts (`trust`) only after the user accepted it. The known_hosts
entry names the host as OpenSSH does: the HostName the ssh config resolves the alias to, `[host]:port` when
the port is not 22; the file is the config's UserKnownHostsFile where it names one, else ~/.ssh/known_hosts.

Also here: which public key a host would be given where key authentication fails (`public_key_for`: the
config's IdentityFile, else the first of ssh's default keys), and the `ssh` command that appends it to the
host's authorized_keys over a session the user authenticates (what `ssh-copy-id` does).
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from sparktop.remote.base import TransportError
from sparktop.remote.ssh import DEFAULT_CONFIG

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")  # the keys ssh offers when the config names none, in its order


@dataclass(frozen=True)
class Target:
    """Where an ssh host name (or config alias) leads: what ssh connects to, as whom, with which keys."""

    alias: str
    host: str
    port: int
    user: str | None
    identity_files: tuple[str, ...] = ()
    known_hosts: str | None = None  # the config's UserKnownHostsFile (its first), where a trusted key goes

    @property
    def known_hosts_name(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"



@dataclass(frozen=True)
class HostKey:
    target: Target
    algorithm: str
    fingerprint: str  # SHA256:..., as `ssh` and `ssh-keygen -lf` print it
    line: str  # the known_hosts line that trusts it


def _config_paths(config: list[str] | None) -> list[str]:
    if config is not None:
        return config
    default = Path(DEFAULT_CONFIG).expanduser()
    return [str(default)] if default.exists() else []


def resolve(alias: str, user: str | None = None, port: int | None = None,
            config: list[str] | None = None) -> Target:
    """The ssh config's answer for `alias` (HostName, Port, User, IdentityFile), the arguments winning."""
    try:
        options = asyncssh.SSHClientConnectionOptions(config=_config_paths(config), host=alias,
                                                      port=port or (), username=user or (), known_hosts=None,
                                                      client_keys=None)
    except (OSError, asyncssh.Error, ValueError) as exc:
        raise TransportError(alias, f"cannot read the ssh config: {exc}") from None
    files: list[str] = list(options.config.get("IdentityFile") or [])  # type: ignore[call-overload]
    known: list[str] = list(options.config.get("UserKnownHostsFile") or [])  # type: ignore[call-overload]
    return Target(alias, str(options.host or alias), int(options.port or 22), user or options.username or None,
                  tuple(str(Path(f).expanduser()) for f in files),
                  str(Path(known[0]).expanduser()) if known else None)


async def host_key(target: Target, timeout: float = 10.0) -> HostKey:
    """The key the host presents in the handshake (nothing is authenticated, nothing is trusted)."""
    try:
        key = await asyncssh.get_server_host_key(target.host, target.port, options=asyncssh.SSHClientConnectionOptions(
            connect_timeout=timeout, known_hosts=None))
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise TransportError(target.alias, f"cannot read the host key of {target.known_hosts_name}: "
                                           f"{getattr(exc, 'strerror', None) or exc}") from None
    if key is None:
        raise TransportError(target.alias, f"{target.known_hosts_name} presented no host key")
    public = key.export_public_key("openssh").decode().split()
    return HostKey(target, public[0], key.get_fingerprint("sha256"),
                   f"{target.known_hosts_name} {public[0]} {public[1]}")


def known_fingerprints(target: Target, path: Path | None = None) -> list[str]:
    """The fingerprints of the keys known_hosts already holds for this host (hashed entries too): a key presented
    that is not among them is a changed key, which is never trusted here, whatever the user passed."""
    path = path or (Path(target.known_hosts) if target.known_hosts else known_hosts_path())
    try:
        known = asyncssh.read_known_hosts(str(path))
    except (OSError, ValueError, asyncssh.Error):
        return []
    try:
        ipaddress.ip_address(target.host)
        addr = target.host
    except ValueError:
        addr = ""
    keys = known.match(target.host, addr, target.port if target.port != 22 else None)[0]
    return [k.get_fingerprint("sha256") for k in keys]


def known_hosts_path() -> Path:
    return Path("~/.ssh/known_hosts").expanduser()


def trust(key: HostKey, path: Path | None = None) -> Path:
    """Append the key's line to known_hosts (made 0600 in a 0700 ~/.ssh when new); a line already there is
    not added twice."""
    path = path or (Path(key.target.known_hosts) if key.target.known_hosts else known_hosts_path())
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    existing = path.read_text() if path.exists() else ""
    if key.line in existing.splitlines():
        return path
    with path.open("a") as f:
        if existing and not existing.endswith("\n"):
            f.write("\n")
        f.write(key.line + "\n")
    path.chmod(0o600)
    return path


def public_key_for(target: Target) -> Path | None:
    """The public key a host would be given: the config's IdentityFile's, else ssh's first default key's."""
    candidates = [Path(f) for f in target.identity_files] or [Path("~/.ssh").expanduser() / k for k in DEFAULT_KEYS]
    for private in candidates:
        public = private.with_name(private.name + ".pub")
        if public.is_file():
            return public
    return None


# Appends the key on its standard input to ~/.ssh/authorized_keys unless it is there (ssh-copy-id's job), 0600:
# the user's key on a node (`copy_id_command`), and one node's key on another (setup's mesh fix).
AUTHORIZE = ("umask 077; mkdir -p ~/.ssh && touch ~/.ssh/authorized_keys && chmod 600 ~/.ssh/authorized_keys "
             "&& k=$(cat) && { grep -qxF \"$k\" ~/.ssh/authorized_keys || "
             "printf '%s\\n' \"$k\" >> ~/.ssh/authorized_keys; }")


def copy_id_command(target: Target, public_key: Path, config: list[str] | None = None) -> list[str]:
    """`ssh` that appends the key to the host's authorized_keys unless it is there (ssh-copy-id's job), over a
    session the user authenticates (a password, typed at ssh's own prompt); the key goes on its standard input.
    It reads the ssh config and known_hosts sparktop itself read (`$HOME`'s: ssh alone would take the passwd
    entry's home), so it reaches the same host and checks the same host key."""
    files = _config_paths(config)
    known = target.known_hosts or str(known_hosts_path())
    user = ["-l", target.user] if target.user else []
    return ["ssh", *(["-F", files[0]] if files else []), "-o", f"UserKnownHostsFile={known}", *user,
            "-o", "PubkeyAuthentication=no", target.alias, AUTHORIZE]


def shown(argv: list[str], public_key: Path) -> str:
    """The command as a person would type it."""
    return f"{shlex.join(argv)} < {shlex.quote(str(public_key))}"
