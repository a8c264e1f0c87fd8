"""Which machine a node is (its DMI strings), and why its GPU clock is held down.

GB10 ships as NVIDIA's DGX Spark (Founders Edition) and as partner boxes
(ASUS, Dell, HP, Lenovo, MSI, GIGABYTE, Acer): same chip and software, other
chassis, cooling and firmware. A mixed cluster is easier to read, and a
firmware problem easier to pin down, when each node says which one it is.
`/sys/class/dmi/id/` is world-readable, so no root is needed.

What real machines report (tests/fixtures/dmi/, SOURCES.md says where from):

- Founders Edition: sys_vendor `NVIDIA`, product_name `NVIDIA_DGX_Spark`
  (underscores), product_family `DGX Spark`;
- Dell: sys_vendor `Dell  Inc.` (two spaces), product_name
  `Dell Pro Max with GB10 FCM1253`, product_family `DGX Spark`;
- ASUS: `ASUSTeK COMPUTER INC.`, `GX10`, `DGX Spark`;
- Lenovo: `LENOVO`, a machine-type-model such as `30KL0005GF`, family not seen.

HP, MSI, GIGABYTE and Acer strings were not found published; they are matched
on vendor and the product names their makers use, and on product_family
`DGX Spark` (which every OEM seen so far keeps).

The second half decodes nvidia-smi's `clocks_event_reasons.active` bitmask
(`clocks_throttle_reasons.active` before driver 535) into words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Read with the `read` builtin: no process per file. `|| :` so a missing file
# does not end a `set -e` caller. `printf`, not `echo`: a DMI string is
# firmware text and may hold a backslash.
DMI_SCRIPT = r"""printf '%s\n' '@@dmi'
for _dmi_f in sys_vendor product_name product_family; do
  _dmi_v=
  { read -r _dmi_v < "${SPARKTOP_SYS_ROOT:-/sys}/class/dmi/id/$_dmi_f" || :; } 2>/dev/null
  printf '%s=%s\n' "$_dmi_f" "$_dmi_v"
done
"""

# Strings firmware leaves in fields nobody programmed.
_PLACEHOLDERS = {
    "", "to be filled by o.e.m.", "default string", "system product name", "system manufacturer",
    "not specified", "not applicable", "none", "n/a", "unknown", "o.e.m.", "oem", "invalid",
}


@dataclass(frozen=True)
class Machine:
    vendor: str | None  # sys_vendor, whitespace tidied
    product: str | None  # product_name, whitespace tidied
    family: str | None  # product_family
    variant: str  # what to call it on screen
    gb10: bool = False


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    text = " ".join(value.split())
    return None if text.lower() in _PLACEHOLDERS else text


def _words(text: str | None) -> str:
    # Lowercase, `_` and `-` as spaces: FE's product is `NVIDIA_DGX_Spark`.
    return " ".join(re.sub(r"[_\-]", " ", text or "").lower().split())


# (variant, vendor test, product words that say "this is the GB10 model")
_VARIANTS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("DGX Spark", ("nvidia",), ("dgx spark", "gb10")),
    ("ASUS Ascent GX10", ("asustek", "asus"), ("gx10", "ascent")),
    ("Dell Pro Max GB10", ("dell",), ("gb10", "fcm1253")),
    ("HP ZGX Nano", ("hp", "hewlett packard"), ("zgx",)),
    # Lenovo puts its machine type (30KL) in product_name, not the model name.
    ("Lenovo ThinkStation PGX", ("lenovo",), ("30kl", "pgx")),
    ("MSI EdgeXpert", ("micro star", "msi"), ("edgexpert", "ms c931")),
    ("GIGABYTE AI TOP ATOM", ("gigabyte", "giga byte"), ("ai top atom", "gb10")),
    ("Acer Veriton GN100", ("acer",), ("gn100", "veriton")),
]


def _vendor_is(vendor: str, names: tuple[str, ...]) -> bool:
    # Whole words: "hp" must not match inside another vendor's name.
    padded = f" {vendor} "
    return any(f" {name} " in padded for name in names)


def identify(sys_vendor: str | None, product_name: str | None, product_family: str | None) -> Machine | None:
    """Name the machine from its DMI strings; None when none was readable."""
    vendor, product, family = _clean(sys_vendor), _clean(product_name), _clean(product_family)
    if vendor is None and product is None and family is None:
        return None
    v, p = _words(vendor), _words(product)
    spark_family = "dgx spark" in _words(family)
    for variant, vendors, products in _VARIANTS:
        if _vendor_is(v, vendors) and (spark_family or any(word in p for word in products)):
            return Machine(vendor, product, family, variant, gb10=True)
    named = " ".join(x for x in (vendor, product) if x) or (family or "")
    if spark_family or "dgx spark" in p:
        # A GB10 from a maker this table does not know yet.
        return Machine(vendor, product, family, f"GB10 ({named})", gb10=True)
    return Machine(vendor, product, family, named)


def parse_dmi_section(text: str) -> Machine | None:
    """The `key=value` lines `DMI_SCRIPT` prints (its `@@dmi` line optional)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value
    return identify(fields.get("sys_vendor"), fields.get("product_name"), fields.get("product_family"))


# -- clock event ("throttle") reasons -------------------------------------------

# NVML's nvmlClocksEventReason* bits (nvml.h; nvidia-ml-py has the same values).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "idle",
    0x2: "applications clocks setting",
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "thermal (software)",
    0x40: "thermal (hardware)",
    0x80: "power brake (hardware)",
    0x100: "display clock setting",
}

# Reasons that are the GPU resting or doing what it was told, not being held back.
_NOT_LIMITING = {"idle", "applications clocks setting"}


def throttle_reasons(value: str) -> list[str]:
    """Decode `0x0000000000000004` into ["power cap"]; [] for N/A or junk.

    A bit NVML does not define yet is kept as `unknown (0x...)` rather than
    dropped: a new reason is still a reason.
    """
    text = value.strip().lower()
    try:
        mask = int(text, 16)
    except ValueError:
        return []  # "[N/A]", "Not Supported", "" and anything else unreadable
    if mask < 0:
        return []
    out = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            out.append(THROTTLE_REASONS.get(bit, f"unknown (0x{bit:x})"))
        bit <<= 1
    return out


def limiting(reasons: list[str]) -> list[str]:
    """The reasons that hold the clock back: all but idling and a clock setting."""
    return [r for r in reasons if r not in _NOT_LIMITING]


def is_clock_limited(reasons: list[str]) -> bool:
    """True when something other than idling or a clock setting holds the clock."""
    return bool(limiting(reasons))
