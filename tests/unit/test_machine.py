"""Which GB10 variant a node is (DMI), DMI_SCRIPT run for real, clock event reasons.

Captures (tests/fixtures/SOURCES.md has their origin):
- dmi/dmidecode-t-system_dell-pro-max-gb10-fcm1253_sbc-bench.txt: Dell Pro Max
  with GB10, `dmidecode -t system` lines from an sbc-bench run;
- dmi/all-smi-chassis-metrics_dgx-spark-fe_all-smi-pr-148.txt: a DGX Spark
  Founders Edition's DMI as all-smi exported it (lablup/all-smi PR #148);
- dmi/dmi-fields_asus-ascent-gx10_metaspartan-sparktop-readme.txt: ASUS Ascent
  GX10 fields quoted in metaspartan/sparktop's README;
- dmi/validated-values_lenovo-thinkstation-pgx-30kl0005gf_spark-energy-management.txt:
  `cat /sys/class/dmi/id/{sys_vendor,product_name}` on a ThinkStation PGX;
- nvidia-smi/csv_gtx1080_clocks-throttle-reasons-supported_with-header_nvidia-settings-issue-80.csv:
  an nvidia-smi reasons bitmask with its header (GTX 1080).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from sparktop.observe.machine import (
    DMI_SCRIPT,
    THROTTLE_REASONS,
    identify,
    is_clock_limited,
    parse_dmi_section,
    throttle_reasons,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DMI = FIXTURES / "dmi"
SH = shutil.which("sh") or "/bin/sh"


def dell_fields() -> dict[str, str]:
    lines = (DMI / "dmidecode-t-system_dell-pro-max-gb10-fcm1253_sbc-bench.txt").read_text().splitlines()
    assert lines[0] == "Device Info:"
    # dmidecode prints the SMBIOS string after "Key: " exactly as sysfs holds it.
    return dict(line.strip().split(": ", 1) for line in lines[1:])


# -- identify on real strings ---------------------------------------------------------


def test_dell_pro_max_from_its_dmidecode_lines():
    f = dell_fields()
    assert f["Manufacturer"] == "Dell  Inc."  # two spaces, as Dell's firmware has it
    m = identify(f["Manufacturer"], f["Product Name"], f["Family"])
    assert m is not None and m.gb10
    assert m.variant == "Dell Pro Max GB10"
    assert m.vendor == "Dell Inc."
    assert m.product == "Dell Pro Max with GB10 FCM1253"
    assert m.family == "DGX Spark"


def test_founders_edition_from_all_smi_export_without_a_family():
    line = (DMI / "all-smi-chassis-metrics_dgx-spark-fe_all-smi-pr-148.txt").read_text().splitlines()[0]
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    assert labels["product_name"] == "NVIDIA_DGX_Spark"
    m = identify(labels["vendor"], labels["product_name"], None)
    assert m is not None and m.gb10 and m.variant == "DGX Spark"


def test_asus_ascent_gx10_from_the_quoted_fields():
    text = (DMI / "dmi-fields_asus-ascent-gx10_metaspartan-sparktop-readme.txt").read_text()
    f = dict(line.split(None, 1) for line in text.splitlines())
    m = identify(f["sys_vendor"], f["product_name"], f["product_family"])
    assert m is not None and m.variant == "ASUS Ascent GX10" and m.vendor == "ASUSTeK COMPUTER INC."


def test_lenovo_thinkstation_pgx_from_its_machine_type_without_a_family():
    lines = (DMI / "validated-values_lenovo-thinkstation-pgx-30kl0005gf_spark-energy-management.txt").read_text()
    vendor, product = lines.splitlines()[2:4]  # the answers of `cat sys_vendor` and `cat product_name`
    m = identify(vendor, product, None)
    assert m is not None and m.variant == "Lenovo ThinkStation PGX" and m.product == "30KL0005GF"
    assert identify("LENOVO", "30KLS02X00", None).variant == "Lenovo ThinkStation PGX"  # another SKU


# -- identify: the other makers, unknown GB10s and non-GB10 machines ----------------------


def test_every_partner_is_named_from_vendor_and_family():
    cases = {
        "NVIDIA": "DGX Spark",
        "ASUSTeK COMPUTER INC.": "ASUS Ascent GX10",
        "Dell  Inc.": "Dell Pro Max GB10",
        "HP": "HP ZGX Nano",
        "LENOVO": "Lenovo ThinkStation PGX",
        "Micro-Star International Co., Ltd.": "MSI EdgeXpert",
        "GIGABYTE": "GIGABYTE AI TOP ATOM",
        "Acer": "Acer Veriton GN100",
    }
    for vendor, variant in cases.items():
        m = identify(vendor, "whatever", "DGX Spark")
        assert m is not None and (m.variant, m.gb10) == (variant, True), vendor


def test_case_whitespace_and_trailing_newlines_do_not_matter():
    m = identify("  hp\n", "HP ZGX Nano G1n AI Station\n", "")
    assert m is not None and m.variant == "HP ZGX Nano" and m.vendor == "hp"
    m = identify("nvidia\n", "nvidia dgx spark\n", "dgx spark\n")
    assert m is not None and m.variant == "DGX Spark"


def test_an_unknown_gb10_maker_is_still_a_gb10():
    # XFUSION's box is in a GB10 kernel module's DMI table; sparktop has no name for it.
    m = identify("XFUSION", "FusionXpark GB10", "DGX Spark\n")
    assert m is not None and m.gb10
    assert m.variant == "GB10 (XFUSION FusionXpark GB10)"


def test_a_machine_that_is_not_a_gb10_keeps_its_own_name():
    m = identify("Dell Inc.", "PowerEdge R760", "PowerEdge")
    assert m is not None and not m.gb10
    assert m.variant == "Dell Inc. PowerEdge R760"  # a Dell, but not a Pro Max GB10
    assert identify("NVIDIA", "DGXH100", "DGX").variant == "NVIDIA DGXH100"


def test_nothing_readable_is_no_machine():
    assert identify(None, None, None) is None
    assert identify("", "To be filled by O.E.M.\n", "Default string") is None


# -- DMI_SCRIPT on a fake /sys ------------------------------------------------------------


def run_dmi_script(sys_root: Path, tmp_path: Path) -> str:
    (tmp_path / "empty").mkdir(exist_ok=True)
    result = subprocess.run(
        [SH, "-c", DMI_SCRIPT],
        env={"SPARKTOP_SYS_ROOT": str(sys_root), "PATH": str(tmp_path / "empty")},  # builtins only
        capture_output=True, text=True, timeout=10, check=True,
    )
    assert result.stderr == ""
    return result.stdout


def test_dmi_script_reads_the_dell_strings_as_sysfs_holds_them(tmp_path):
    f = dell_fields()
    dmi = tmp_path / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text(f["Manufacturer"] + "\n")
    (dmi / "product_name").write_text(f["Product Name"] + "\n")
    (dmi / "product_family").write_text(f["Family"] + "\n")
    out = run_dmi_script(tmp_path / "sys", tmp_path)
    assert out.splitlines() == [
        "@@dmi",
        "sys_vendor=Dell  Inc.",  # the inner double space survives `read`
        "product_name=Dell Pro Max with GB10 FCM1253",
        "product_family=DGX Spark",
    ]
    m = parse_dmi_section(out)
    assert m is not None and m.variant == "Dell Pro Max GB10"


def test_dmi_script_with_a_missing_family_file_and_with_no_dmi_at_all(tmp_path):
    dmi = tmp_path / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("NVIDIA\n")
    (dmi / "product_name").write_text("NVIDIA_DGX_Spark\n")
    out = run_dmi_script(tmp_path / "sys", tmp_path)
    assert "product_family=" in out.splitlines()
    m = parse_dmi_section(out)
    assert m is not None and m.variant == "DGX Spark" and m.family is None
    # A VM or a container without /sys/class/dmi: no machine, no error.
    assert parse_dmi_section(run_dmi_script(tmp_path / "nowhere", tmp_path)) is None


# -- clock event reasons ----------------------------------------------------------------


def test_reasons_bitmask_from_nvidia_smi_decodes_every_nvml_reason():
    header, value = (FIXTURES / "nvidia-smi" /
                     "csv_gtx1080_clocks-throttle-reasons-supported_with-header_nvidia-settings-issue-80.csv"
                     ).read_text().splitlines()
    assert header == "clocks_throttle_reasons.supported"
    reasons = throttle_reasons(value)
    assert reasons == list(THROTTLE_REASONS.values())  # 0x1FF: all nine, lowest bit first
    assert is_clock_limited(reasons)


def test_common_masks_read_as_a_user_would_say_them():
    assert throttle_reasons("0x0000000000000000") == []
    assert throttle_reasons("0x0000000000000001") == ["idle"]
    assert throttle_reasons("0x0000000000000004") == ["power cap"]
    assert throttle_reasons(" 0x0000000000000024\n") == ["power cap", "thermal (software)"]
    assert throttle_reasons("0x0000000000000048") == ["hardware slowdown", "thermal (hardware)"]
    assert throttle_reasons("0x0000000000000200") == ["unknown (0x200)"]  # a bit newer than this table


def test_unreadable_values_are_no_reasons():
    for value in ("[N/A]", "N/A", "Not Supported", "[Not Supported]", "", "  ", "[Unknown Error]"):
        assert throttle_reasons(value) == [], value


def test_idle_and_applications_clocks_are_not_a_limit_worth_showing():
    assert not is_clock_limited([])
    assert not is_clock_limited(["idle"])
    assert not is_clock_limited(["idle", "applications clocks setting"])
    assert is_clock_limited(["idle", "power cap"])
    assert is_clock_limited(throttle_reasons("0x0000000000000008"))
