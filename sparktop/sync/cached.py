"""What each node has cached: the models in its Hugging Face cache (sizes, complete or not), the copies
`sparktop sync` left staged beside it (an interrupted copy, which the next sync resumes), and its Docker images.

`sparktop cache` prints it, the app's cache screen shows it; one shell round trip per node for each listing.
"""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass, field

from sparktop.remote import Transport, TransportError
from sparktop.settings import Inventory
from sparktop.sync import hfcache
from sparktop.sync.images import LIST_COMMAND, Image, parse_images
from sparktop.sync.transfer import STAGING, human_bytes


@dataclass
class NodeCache:
    node: str
    hf_cache: str
    models: list[hfcache.CachedModel] = field(default_factory=list)
    images: list[Image] = field(default_factory=list)
    staged: list[hfcache.CachedModel] = field(default_factory=list)  # partial copies in the sync's staging folder
    error: str | None = None  # the node could not be read
    images_error: str | None = None  # docker could not list its images

    def as_dict(self) -> dict:
        return {
            "node": self.node, "hf_cache": self.hf_cache, "error": self.error, "images_error": self.images_error,
            "models": [{"repo_id": m.repo_id, "bytes": m.size, "revision": m.revision, "complete": m.complete,
                        "problems": m.problems()} for m in self.models],
            "images": [{"name": i.name, "id": i.id, "bytes": i.size} for i in self.images],
            "staged": [{"repo_id": m.repo_id, "bytes": m.size} for m in self.staged],
        }


def _under(hf_cache: str, sub: str) -> str:
    """A folder of the cache as the node's shell reads it (`~/` is the node user's home)."""
    cache = hf_cache.rstrip("/")
    if cache == "~" or cache.startswith("~/"):
        return '"$HOME"' + shlex.quote(cache[1:] + "/" + sub)
    return shlex.quote(cache + "/" + sub)


COLUMNS = ("node", "kind", "name", "size", "state")


def rows(caches: list[NodeCache]) -> list[tuple[str, str, str, str, str, str]]:
    """A row per model and image of every node, as `sparktop cache` and the app's cache screen show them:
    (node, kind, name, size, state, level), level `ok`, `warn` (incomplete, a copy left staged, docker unreadable)
    or `error` (the node unreachable)."""
    out = []
    for cache in caches:
        if cache.error:
            out.append((cache.node, "", "", "", cache.error, "error"))
            continue
        for m in cache.models:
            problems = m.problems()
            state = f"complete, revision {(m.revision or '?')[:12]}" if not problems else f"incomplete: {problems[0]}"
            out.append((cache.node, "model", m.repo_id, human_bytes(m.size), state, "warn" if problems else "ok"))
        for m in cache.staged:
            out.append((cache.node, "staged", m.repo_id, human_bytes(m.size),
                        "a copy interrupted: the next sparktop sync resumes it", "warn"))
        for i in cache.images:
            out.append((cache.node, "image", i.name, human_bytes(i.size), i.id[:19], "ok"))
        if cache.images_error:
            out.append((cache.node, "image", "", "", cache.images_error, "warn"))
        if not cache.models and not cache.images:
            out.append((cache.node, "", f"nothing in {cache.hf_cache}, no images", "", "", "ok"))
    return out


async def node_cache(name: str, transport: Transport, hf_cache: str) -> NodeCache:
    out = NodeCache(name, hf_cache)
    try:
        r = await transport.run(hfcache.listing_script(_under(hf_cache, "hub")), timeout=120)
        if not r.ok:
            out.error = f"listing {hf_cache}: {r.first_error_line()}"
        else:
            out.models = sorted(hfcache.parse_listing(r.stdout).values(), key=lambda m: m.repo_id)
        r = await transport.run(hfcache.listing_script(_under(hf_cache, STAGING)), timeout=120)
        if r.ok:
            out.staged = sorted(hfcache.parse_listing(r.stdout).values(), key=lambda m: m.repo_id)
        r = await transport.run(LIST_COMMAND)
        if r.ok:
            out.images = parse_images(r.stdout)
        else:
            out.images_error = f"{LIST_COMMAND}: {r.first_error_line()}"
    except TransportError as exc:
        out.error = exc.message
    return out


async def cluster_cache(inventory: Inventory, transports: dict[str, Transport]) -> list[NodeCache]:
    return list(await asyncio.gather(*(node_cache(n.name, transports[n.name], inventory.defaults.hf_cache)
                                       for n in inventory.nodes)))
