"""Where things live, and the cluster inventory.

Locations follow the XDG base directory spec:

- config:  $XDG_CONFIG_HOME/sparktop   (cluster.yaml, user recipes)
- results: $XDG_DATA_HOME/sparktop/results  (sweep runs)
- state:   $XDG_STATE_HOME/sparktop    (what sparktop launched, logs)

The inventory (`cluster.yaml`) names the nodes and how to reach them::

    defaults:
      image: vllm/vllm-openai:v0.11.0
      hf_cache: ~/.cache/huggingface
      port: 8000
    nodes:
      - name: spark-a
        host: spark-a            # ssh host or ~/.ssh/config alias
        fabric_ip: 192.168.100.10
        eth_if: enp1s0f1np1
        ib_if: [rocep1s0f1, roceP2p1s0f1]
      - name: spark-b
        host: spark-b
        ...

With no inventory sparktop watches the node it runs on and vLLM on localhost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sparktop import engine_ids
from sparktop.errors import ConfigError
from sparktop.yamlfile import check_keys, line_of, load_file

APP = "sparktop"
LOCAL_HOSTS = {"localhost", "local", ""}


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var)
    return Path(value) if value else Path.home() / default


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / APP


def data_dir() -> Path:
    return _xdg("XDG_DATA_HOME", ".local/share") / APP


def state_dir() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state") / APP


def results_dir() -> Path:
    return data_dir() / "results"


def logs_dir() -> Path:
    return state_dir() / "logs"


def inventory_path() -> Path:
    return config_dir() / "cluster.yaml"


def shipped_recipes_dir() -> Path:
    """Recipes that ship with sparktop (in the wheel or in a source checkout)."""
    here = Path(__file__).resolve().parent
    packaged = here / "_recipes"
    return packaged if packaged.is_dir() else here.parent / "recipes"


@dataclass
class Defaults:
    # DEFAULT's (vLLM's) image: engine_ids has NVIDIA's vLLM build for GB10 (arm64, CUDA 13).
    image: str = engine_ids.get(engine_ids.DEFAULT).default_image
    # LiteLLM's released proxy image (ENTRYPOINT ["litellm"], amd64 and arm64), pinned in engine_ids to the
    # version the lab tests against (litellm[proxy]==1.106.2); change it with `router_image:` under `defaults:`.
    router_image: str = engine_ids.get(engine_ids.ROUTER).default_image
    # HAProxy's official image (ENTRYPOINT docker-entrypoint.sh; sparktop runs `haproxy` itself), the router
    # in front of replicas unless a layout names a LiteLLM strategy; change it with `haproxy_image:`.
    haproxy_image: str = engine_ids.get(engine_ids.HAPROXY).default_image
    hf_cache: str = "~/.cache/huggingface"
    port: int = engine_ids.get(engine_ids.DEFAULT).default_port
    router_port: int = engine_ids.get(engine_ids.ROUTER).default_port  # either router's (HAProxy's or LiteLLM's)
    ray_port: int = 6379
    master_port: int = 29501
    container_env: dict = field(default_factory=dict)  # added to every container sparktop starts
    # The image of each other runtime where a recipe names none, by engine_ids' id (`sglang`, `llama.cpp`,
    # `trtllm`; read from any of their names, `llama-cpp` too); `image` above is vLLM's.
    images: dict = field(default_factory=dict)
    # The nodes' pace against a GB10's: twin hosts started with --speed S run S times as fast, and every
    # prediction for this inventory is scaled the same (1 for real Sparks).
    twin_speed: float = 1.0
    # This cluster's history file (`sparktop history`, `collect` and the app read and write it); None:
    # $XDG_DATA_HOME/sparktop/history.sqlite. The demo's inventory names its own, so twins stay out of yours.
    history_file: str | None = None

    def image_for(self, runtime: str) -> str:
        """The image a runtime's engine runs in where a recipe names none: `image` for DEFAULT's (vLLM's),
        else `images` or its engine_ids row's default image ("" when neither has one)."""
        row = engine_ids.get(runtime)
        if row.id == engine_ids.DEFAULT:
            return self.image
        return self.images.get(row.id) or row.default_image


@dataclass
class Node:
    """One host: how to reach it and its fast-link settings."""

    name: str
    host: str = "localhost"
    user: str | None = None
    port: int | None = None
    fabric_ip: str | None = None
    eth_if: str | None = None
    ib_if: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    bind: str = "0.0.0.0"  # where engines on this node listen

    @property
    def is_local(self) -> bool:
        return self.host in LOCAL_HOSTS

    @property
    def address(self) -> str:
        """Address other nodes and engines use to reach this node."""
        if self.fabric_ip:
            return self.fabric_ip
        return "127.0.0.1" if self.is_local else self.host


@dataclass
class Inventory:
    nodes: list[Node]
    defaults: Defaults = field(default_factory=Defaults)
    path: Path | None = None

    @property
    def head(self) -> Node:
        return self.nodes[0]

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name or node.host == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        where = str(self.path) if self.path else "inventory"
        raise ConfigError(where, None, "nodes", f"no node named {name!r} (known: {known})")


NODE_KEYS = ("name", "host", "user", "port", "fabric_ip", "eth_if", "ib_if", "env", "bind")
DEFAULT_KEYS = tuple(Defaults.__dataclass_fields__)


def local_inventory() -> Inventory:
    """No inventory: this node only."""
    return Inventory(nodes=[Node(name=os.uname().nodename or "localhost", host="localhost")])


def inventory_from_hosts(hosts: list[str]) -> Inventory:
    """A one-off inventory from `--nodes a,b`: the first host is the head."""
    return Inventory(nodes=[Node(name=h, host=h) for h in hosts])


def _typed(value, kind, path, line, key):
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, line, key, f"must be true or false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, line, key, f"must be an integer, got {value!r}")
        return value
    if not isinstance(value, str):
        raise ConfigError(path, line, key, f"must be a string, got {value!r}")
    return value


def sparkrun_default_cluster() -> Path | None:
    """sparkrun's default cluster file (~/.config/sparkrun/clusters/<name>.yaml), if set."""
    folder = Path.home() / ".config" / "sparkrun" / "clusters"
    try:
        name = (folder / ".default").read_text().strip()
    except OSError:
        return None
    path = folder / f"{name}.yaml"
    return path if name and path.exists() else None


def load_eugr_env(path: Path) -> Inventory:
    """eugr/spark-vllm-docker's .env: CLUSTER_NODES (first is the head),
    LOCAL_IP, ETH_IF, IB_IF, and CONTAINER_* variables for the containers."""
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip().removeprefix("export ").strip()
        values[key] = value.strip().strip("'\"")
        lines[key] = number
    nodes_raw = [n.strip() for n in values.get("CLUSTER_NODES", "").split(",") if n.strip()]
    if not nodes_raw:
        raise ConfigError(str(path), lines.get("CLUSTER_NODES"), "CLUSTER_NODES", "names no nodes")
    ib = [i.strip() for i in values.get("IB_IF", "").split(",") if i.strip()]
    local = values.get("LOCAL_IP")
    nodes = [Node(name=ip, host="localhost" if ip == local else ip, fabric_ip=ip, eth_if=values.get("ETH_IF"),
                  ib_if=list(ib)) for ip in nodes_raw]
    defaults = Defaults()
    defaults.container_env = {k.removeprefix("CONTAINER_"): v for k, v in values.items() if k.startswith("CONTAINER_")}
    return Inventory(nodes=nodes, defaults=defaults, path=path)


def load_sparkrun_cluster(doc: dict, path: Path) -> Inventory:
    """A sparkrun cluster file: name, hosts (first is the head), user, cache_dir."""
    hosts = doc.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError(str(path), line_of(doc, "hosts"), "hosts", "must be a non-empty list of hosts")
    user = doc.get("user")
    nodes = [Node(name=str(h), host=str(h), user=str(user) if user else None) for h in hosts]
    defaults = Defaults()
    if doc.get("cache_dir"):
        defaults.hf_cache = str(doc["cache_dir"])
    return Inventory(nodes=nodes, defaults=defaults, path=path)


def _images(raw: dict, path: Path) -> dict[str, str]:
    """`defaults.images`, keyed by engine_ids' ids (`llama-cpp:` is llama.cpp's); a key naming no engine is an
    error at its line."""
    out = {}
    for key, image in raw.items():
        row = engine_ids.lookup(str(key))
        if row is None:
            known = ", ".join(r.sparkrun or r.id for r in engine_ids.ROWS if r.default_image and not r.router)
            raise ConfigError(str(path), line_of(raw, key), f"defaults.images.{key}",
                              f"names no engine sparktop knows ({known})")
        out[row.id] = str(image)
    return out


def _read_defaults(doc: dict, path: Path) -> Defaults:
    defaults = Defaults()
    raw_defaults = doc.get("defaults") or {}
    if not isinstance(raw_defaults, dict):
        raise ConfigError(str(path), line_of(doc, "defaults"), "defaults", "must be a mapping")
    check_keys(raw_defaults, DEFAULT_KEYS, path, "defaults")
    for key, value in raw_defaults.items():
        if key in ("container_env", "images"):
            if not isinstance(value, dict):
                raise ConfigError(str(path), line_of(raw_defaults, key), f"defaults.{key}", "must be a mapping")
            if key == "images":
                setattr(defaults, key, _images(value, path))
                continue
            setattr(defaults, key, {str(k): str(v) for k, v in value.items()})
            continue
        if key == "twin_speed":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(str(path), line_of(raw_defaults, key), "defaults.twin_speed",
                                  f"must be a positive number, got {value!r}")
            defaults.twin_speed = float(value)
            continue
        kind = int if key.endswith("port") else str
        setattr(defaults, key, _typed(value, kind, str(path), line_of(raw_defaults, key), f"defaults.{key}"))
    return defaults


def _read_node(raw, raw_nodes: list, index: int, path: Path) -> Node:
    """One entry of `nodes:`: a host name, or a mapping."""
    where = f"nodes[{index}]"
    if isinstance(raw, str):
        raw = {"name": raw, "host": raw}
    if not isinstance(raw, dict):
        raise ConfigError(str(path), line_of(raw_nodes, index), where, "must be a mapping or a host name")
    check_keys(raw, NODE_KEYS, path, where)
    name = raw.get("name") or raw.get("host")
    if not name:
        raise ConfigError(str(path), line_of(raw_nodes, index), f"{where}.name", "a node needs a name or a host")
    node = Node(name=str(name), host=str(raw.get("host", name)))
    for key in ("user", "fabric_ip", "eth_if", "bind"):
        if key in raw and raw[key] is not None:
            setattr(node, key, _typed(raw[key], str, str(path), line_of(raw, key), f"{where}.{key}"))
    if "port" in raw:
        node.port = _typed(raw["port"], int, str(path), line_of(raw, "port"), f"{where}.port")
    ib = raw.get("ib_if")
    if isinstance(ib, str):
        node.ib_if = [part.strip() for part in ib.split(",") if part.strip()]
    elif isinstance(ib, list):
        node.ib_if = [str(part) for part in ib]
    elif ib is not None:
        raise ConfigError(str(path), line_of(raw, "ib_if"), f"{where}.ib_if", "must be a name or a list of names")
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(str(path), line_of(raw, "env"), f"{where}.env", "must be a mapping")
    node.env = {str(k): str(v) for k, v in env.items()}
    return node


DEMO_INVENTORY = "demo"  # `--inventory demo`: the inventory `sparktop demo` writes for the cluster it runs


def demo_inventory_path() -> Path:
    """Where `sparktop demo` writes the inventory of the twin cluster it runs (`--inventory demo` reads it)."""
    return state_dir() / "demo" / "inventory.yaml"


def demo_history_path() -> Path:
    """The demo's history: kept across demos (its nodes' folder is made afresh each time), apart from yours;
    `--inventory demo` reads it whether a demo runs or not."""
    return data_dir() / "demo-history.sqlite"


def load_inventory(path: str | Path | None = None) -> Inventory:
    """Read cluster.yaml (or a sparkrun cluster file, or eugr's .env); with no
    file, sparkrun's default cluster if there is one, else this node only.
    `demo` (with no file of that name here): the inventory of the demo that runs."""
    explicit = path is not None
    if explicit and str(path) == DEMO_INVENTORY and not Path(DEMO_INVENTORY).exists():
        if not demo_inventory_path().exists():
            raise ConfigError(DEMO_INVENTORY, None, None, "no demo cluster is running; start one with `sparktop "
                              "demo` (or `sparktop demo --no-wait` to leave it running for other commands)")
        path = demo_inventory_path()
    path = Path(path).expanduser() if path else inventory_path()
    if not path.exists():
        if explicit:
            raise ConfigError(str(path), None, None, "no such file")
        sparkrun = sparkrun_default_cluster()
        if sparkrun is not None:
            return load_inventory(sparkrun)
        return local_inventory()
    if path.name.endswith(".env") or "CLUSTER_NODES=" in path.read_text(errors="replace"):
        return load_eugr_env(path)
    doc = load_file(path)
    if isinstance(doc, dict) and "hosts" in doc and "nodes" not in doc:
        return load_sparkrun_cluster(doc, path)
    if doc is None:
        return local_inventory()
    if not isinstance(doc, dict):
        raise ConfigError(str(path), line_of(doc, 0), None, "must be a mapping with 'nodes:'")
    check_keys(doc, ("nodes", "defaults"), path)
    defaults = _read_defaults(doc, path)
    raw_nodes = doc.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError(str(path), line_of(doc, "nodes"), "nodes", "must be a non-empty list of nodes")
    nodes: list[Node] = []
    for index, raw in enumerate(raw_nodes):
        node = _read_node(raw, raw_nodes, index, path)
        if node.name in {n.name for n in nodes}:
            raise ConfigError(str(path), line_of(raw, "name"), f"nodes[{index}].name",
                              f"duplicate node name {node.name!r}")
        nodes.append(node)
    return Inventory(nodes=nodes, defaults=defaults, path=path)


# -- preferences ---------------------------------------------------------------------


@dataclass
class Preferences:
    """`$XDG_CONFIG_HOME/sparktop/settings.yaml`: what a user sets once.

        energy_price_per_kwh: 0.32   # what a kWh costs you
        currency: EUR                # printed beside costs
        rate_window_s: 10            # the monitor's tokens/s and link rates: over this many seconds
        latency_window_s: 60         # its latency percentiles and acceptance rates: over this many
        history: true                # keep a history (a row a minute per node and engine, sessions, events)
        history_retention_days: 30   # ... for this many days, then the oldest go
    """

    energy_price_per_kwh: float | None = None
    currency: str = ""
    rate_window_s: float = 10.0  # as vLLM's own log line: smooth enough to read, still responsive
    latency_window_s: float = 60.0
    history: bool = True
    history_retention_days: float = 30.0

    def money(self, value: float | None) -> str:
        """A cost as `0.012 EUR` (three significant figures: costs per token are small)."""
        if value is None:
            return "—"
        text = f"{value:.3g}" if value < 100 else f"{value:.0f}"
        return f"{text} {self.currency}".strip()


PREFERENCE_KEYS = tuple(Preferences.__dataclass_fields__)


def preferences_path() -> Path:
    return Path(os.environ["SPARKTOP_SETTINGS"]) if os.environ.get("SPARKTOP_SETTINGS") \
        else config_dir() / "settings.yaml"


def load_preferences(path: str | Path | None = None) -> Preferences:
    """The user's settings; none when the file does not exist."""
    path = Path(path).expanduser() if path else preferences_path()
    if not path.exists():
        return Preferences()
    doc = load_file(path)
    if doc is None:
        return Preferences()
    if not isinstance(doc, dict):
        raise ConfigError(str(path), line_of(doc, 0), None, "must be a mapping of settings")
    check_keys(doc, PREFERENCE_KEYS, path)
    prefs = Preferences()
    price = doc.get("energy_price_per_kwh")
    if price is not None:
        if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
            raise ConfigError(str(path), line_of(doc, "energy_price_per_kwh"), "energy_price_per_kwh",
                              f"must be a price per kWh, a number ≥ 0 (got {price!r})")
        prefs.energy_price_per_kwh = float(price)
    if doc.get("currency") is not None:
        prefs.currency = _typed(doc["currency"], str, str(path), line_of(doc, "currency"), "currency")
    if doc.get("history") is not None:
        prefs.history = _typed(doc["history"], bool, str(path), line_of(doc, "history"), "history")
    days = doc.get("history_retention_days")
    if days is not None:
        if isinstance(days, bool) or not isinstance(days, (int, float)) or not 1 <= days <= 3650:
            raise ConfigError(str(path), line_of(doc, "history_retention_days"), "history_retention_days",
                              f"must be a number of days from 1 to 3650 (got {days!r})")
        prefs.history_retention_days = float(days)
    for key in ("rate_window_s", "latency_window_s"):
        value = doc.get(key)
        if value is None:
            continue
        problem = window_problem(value)
        if problem:
            raise ConfigError(str(path), line_of(doc, key), key, problem)
        setattr(prefs, key, float(value))
    return prefs


WINDOW_RANGE_S = (1.0, 3600.0)


def window_problem(value) -> str | None:
    """Why `value` is not a window in seconds, or None."""
    low, high = WINDOW_RANGE_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        return f"must be a number of seconds from {low:.0f} to {high:.0f} (got {value!r})"
    return None
