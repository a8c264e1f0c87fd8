"""Copying what serving needs between nodes, and what each node has cached.

`sparktop sync` copies a Hugging Face snapshot (rsync over SSH, node to
node, through a staging folder moved into the cache only when whole) or a
Docker image (`docker save | ssh target docker load`, the image ID checked)
from a node that has it to the nodes that lack it; `sparktop cache` lists
each node's models and images. Core code here yields `events.SyncEvent`s;
`commands.py` prints them.
"""
