"""README's launcher defaults table says exactly what launcher/defaults.env holds."""

import re

from tests.unit.test_launcher_support import REPO

_ROW = re.compile(r"^\| `([A-Z_][A-Z0-9_]*)` \| (`[^`]*`|—) \|")
_EMPTY = "—"


def default_settings():
    """NAME -> default from launcher/defaults.env, read as run.sh reads it (literally)."""
    settings = {}
    for line in (REPO / "launcher" / "defaults.env").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, value = line.partition("=")
        assert name not in settings, f"{name} is defined twice"
        settings[name] = value
    return settings


def readme_defaults():
    text = (REPO / "README.md").read_text()
    section = text.split("<!-- section:launcher:start -->", 1)[1]
    section = section.split("<!-- section:launcher:end -->", 1)[0]
    table = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match:
            name, cell = match.groups()
            assert name not in table, f"README lists {name} twice"
            table[name] = "" if cell == _EMPTY else cell.strip("`")
    return table


def test_readme_table_lists_every_default_with_its_value():
    assert readme_defaults() == default_settings()


def test_defaults_are_the_seed_verified_run():
    settings = default_settings()
    assert {name: settings[name] for name in (
        "SPEC", "DRAFTER", "NUM_SPECULATIVE_TOKENS", "MAX_NUM_SEQS", "MAX_MODEL_LEN",
        "ENFORCE_EAGER", "KV_CACHE_MEMORY_BYTES", "KV_CACHE_DTYPE", "IMAGE")} == {
        "SPEC": "dflash2", "DRAFTER": "incoai", "NUM_SPECULATIVE_TOKENS": "5",
        "MAX_NUM_SEQS": "4", "MAX_MODEL_LEN": "327680", "ENFORCE_EAGER": "0",
        "KV_CACHE_MEMORY_BYTES": "4445787956", "KV_CACHE_DTYPE": "fp8_e4m3",
        "IMAGE": "glm53-sm121-v11"}


def test_no_site_values_are_baked_in():
    settings = default_settings()
    assert settings["NODES"] == settings["IFACE"] == settings["HCA"] == ""
    assert settings["MODEL_REVISION"] == settings["DRAFTER_REVISION"] == ""
